"""How a failure is put into words: for error_message (stored), for the log, and for the
task's failed attempts (its exception's type, whole message and traceback).

A handler's exception is its author's: its __str__ may raise, return megabytes, or hold
bytes PostgreSQL text cannot take. None of that may stop the failure being recorded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import traceback

from ..db.store import Failure
from ..errors import TaskCancelled, TaskTimedOut


def storable(text: str) -> str:
    """Text PostgreSQL will take: no NUL, and lone surrogates (a non-UTF-8 file name from
    os.listdir, say) escaped, so that the failure that carries them is still recorded."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


# A handler's exception message is its author's; bound the work done on it.
MAX_MESSAGE_READ = 100_000


def describe(exc: BaseException) -> str:
    """``Type: last line of the message``, whatever the exception's __str__ does."""
    try:
        text = str(exc)
    except Exception as broken:  # noqa: BLE001 - a broken __str__ must not lose the failure
        text = f"(its message could not be read: str() raised {type(broken).__name__})"
    text = storable(text[-MAX_MESSAGE_READ:]).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1]}" if text else type(exc).__name__


def shorten(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def with_origin(exc: BaseException, message: str) -> str:
    """The message plus where the handler raised it, for error_message."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return message
    last = frames[-1]
    return storable(f"{message} (at {last.filename}:{last.lineno} in {last.name})")


# A traceback stored with a failed attempt is at most this long (UTF-8 bytes): its head (the
# outermost frames) and its tail (the innermost, and the exception itself).
MAX_TRACEBACK_BYTES = 16 * 1024
MAX_STORED_MESSAGE = 4000
# Where pgtaskd calls a handler: its own frames above the handler's are left out.
_OWN_FILES = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
              os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep,
              os.path.abspath(threading.__file__),
              os.path.dirname(os.path.abspath(concurrent.futures.__file__)) + os.sep)


def type_name(exc: BaseException) -> str:
    """``ValueError``, or ``package.module.Error`` for one not built in."""
    kind = type(exc)
    module = getattr(kind, "__module__", None)
    name = getattr(kind, "__qualname__", kind.__name__)
    return name if module in (None, "builtins") else f"{module}.{name}"


def message_of(exc: BaseException) -> str:
    """The exception's whole message (not only its last line), bounded."""
    try:
        text = str(exc)
    except Exception as broken:  # noqa: BLE001 - a broken __str__ must not lose the failure
        text = f"(its message could not be read: str() raised {type(broken).__name__})"
    return storable(shorten(text[:MAX_MESSAGE_READ], MAX_STORED_MESSAGE))


def traceback_of(exc: BaseException) -> str | None:
    """The traceback as Python prints it, chained exceptions included, from the handler's
    first frame on, at most MAX_TRACEBACK_BYTES; None for an exception never raised."""
    if exc.__traceback__ is None and exc.__cause__ is None and exc.__context__ is None:
        return None
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None \
            and tb.tb_frame.f_code.co_filename.startswith(_OWN_FILES):
        tb = tb.tb_next
    try:
        text = "".join(traceback.TracebackException(type(exc), exc, tb).format())
    except Exception as broken:  # noqa: BLE001 - a hostile exception must not lose the failure
        return f"(the traceback could not be formatted: {type(broken).__name__})"
    return bounded(storable(text))


def bounded(text: str, limit: int = MAX_TRACEBACK_BYTES) -> str:
    """``text`` if it takes at most ``limit`` bytes in UTF-8, else its head and its tail
    around a line that says how much was left out."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    marker = f"\n... ({len(data):,} bytes; the middle left out) ...\n".encode()
    half = (limit - len(marker)) // 2
    # A cut through a character drops its pieces.
    head = data[:half].decode("utf-8", "ignore")
    tail = data[len(data) - half:].decode("utf-8", "ignore")
    return head + marker.decode() + tail


def failure_of(exc: BaseException, permanent: bool) -> Failure:
    """The failed attempt a worker records for a run that ended with ``exc``."""
    if isinstance(exc, TaskTimedOut):
        outcome = "timeout"
    elif isinstance(exc, TaskCancelled):
        # Not ours any more by our clock, though nobody took it: its lease ran out.
        outcome = "lease_lost"
    else:
        outcome = "permanent" if permanent else "exception"
    return Failure(outcome, type_name(exc), message_of(exc), traceback_of(exc))
