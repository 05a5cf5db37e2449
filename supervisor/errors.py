"""Exceptions that cross module boundaries, and the exit codes they map to."""

EXIT_OK = 0
EXIT_FAILURE = 1  # operational failure: the database is unreachable, a task is missing
EXIT_USAGE = 2  # the input was wrong: a bad argument, a bad config, a bad payload
EXIT_BOOT_FAILED = 3  # a worker child could not import its handlers or reach the database


class PermanentError(Exception):
    """Raised by a handler when retrying cannot help: the task fails at once."""


class TaskCancelled(Exception):
    """Raised by ``task.raise_if_cancelled()`` once the task is no longer ours to finish.

    The worker catches it and writes nothing: the task was cancelled, or its lease
    passed to another worker, and either way the database already holds its state.
    """


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
