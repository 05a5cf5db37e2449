"""Exceptions that cross module boundaries, the exit codes they map to, and how their
messages quote a value."""

import math
import reprlib

EXIT_OK = 0
EXIT_FAILURE = 1  # operational failure: the database is unreachable, a task is missing
EXIT_USAGE = 2  # the input was wrong: a bad argument, a bad config, a bad payload
EXIT_BOOT_FAILED = 3  # a worker child could not import its handlers or reach the database
# The database's schema cannot be used (newer than this code, or a migration it refuses):
# restarting cannot help, so the systemd unit does not (RestartPreventExitStatus).
EXIT_SCHEMA = 4


def one_line(exc: BaseException, limit: int = 300, *, typed: bool = False) -> str:
    """A database or network error for a log field: every line of its message joined (the
    server's is spread over several, and none alone says enough), at most ``limit`` long;
    ``typed`` puts the exception's type first."""
    try:
        # Cut before the join: a message may be megabytes, and only ``limit`` is shown.
        text = " ".join(str(exc)[:4 * limit].split())
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
        text = ""
    if not text:
        return type(exc).__name__
    if typed:
        text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


class PermanentError(Exception):
    """Raised by a handler when retrying cannot help: the task fails at once."""


class TaskCancelled(Exception):
    """Raised by ``task.raise_if_cancelled()`` once the task is no longer ours to finish.

    The worker catches it and writes nothing: the task was cancelled, or its lease
    passed to another worker, and either way the database already holds its state.
    """


class TaskTimedOut(TaskCancelled):
    """The supervisor stopped a run past its task type's ``timeout``: a failed attempt."""


class ConfigError(Exception):
    """A config problem; ``problems`` holds one line per problem, each naming its key path."""

    def __init__(self, problems):
        if isinstance(problems, str):
            problems = [problems]
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class UsageError(Exception):
    """Bad input from the command line or a client call: exit 2, nothing written."""


class OperationalError(Exception):
    """The operation could not be carried out (database down, task missing): exit 1."""


class MigrationError(OperationalError):
    """A migration failed on the database's content (a foreign ``tasks`` table, say):
    waiting and retrying cannot help."""


class _Quoter(reprlib.Repr):
    """reprlib, which stops after a few items, levels and characters, so that quoting a value
    costs the same however large the value is."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxset = 2, 4, 4, 4
        self.maxstring = self.maxother = self.maxlong = 60

    def repr_int(self, x: int, level: int) -> str:
        # repr() refuses integers past Python's int-string limit (4300 digits), which a YAML
        # hex literal reaches in a few kilobytes; long before that, the digits say nothing.
        if x.bit_length() > 128:
            return f"<an integer of about {round(x.bit_length() * math.log10(2))} digits>"
        return super().repr_int(x, level)


_QUOTER = _Quoter()


def quote(value, limit: int = 60) -> str:
    """A value as a message quotes it: its repr, or a short prefix of a huge one (an id of
    10 kB, a 5,000-digit number) so that the line stays readable and its cost small."""
    text = _QUOTER.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
