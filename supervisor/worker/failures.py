"""How a failure is put into words: for error_message (stored) and for the log.

A handler's exception is its author's: its __str__ may raise, return megabytes, or hold
bytes PostgreSQL text cannot take. None of that may stop the failure being recorded.
"""

from __future__ import annotations

import traceback


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
