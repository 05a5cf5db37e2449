"""What an operator gave a command, made ready for the client, and the client's answer back.

The --payload or --payload-file JSON object, bounded before it is parsed; and the client's
complaints about a value, reworded to name the command-line argument that carried it.
"""

from __future__ import annotations

import contextlib
import json
import sys

from ..errors import UsageError
from .output import printable


# The client names a bad value by its parameter; the command line, by the argument typed.
_ARGUMENTS = {"task_type": "TYPE", "task_id": "--id", "name": "--name",
              "priority": "--priority", "max_retries": "--max-retries",
              "unique_key": "--unique-key", "run_at": "--at", "delay": "--in",
              "max_running": "N", "state": "--state", "limit": "--limit", "task_types": "--type", "statuses": "--status",
              "since": "--since", "before": "--before", "error": "--error",
              "id_prefix": "--id-prefix", "name_prefix": "--name-prefix",
              "batch_size": "--batch-size", "max_tasks": "--max"}


@contextlib.contextmanager
def arguments_named():
    """A client's UsageError, reworded to name the command-line argument."""
    try:
        yield
    except UsageError as exc:
        field, colon, rest = str(exc).partition(":")
        if colon and field in _ARGUMENTS:
            raise UsageError(f"{_ARGUMENTS[field]}:{rest}") from None
        raise


def read_payload(text: str | None, path: str | None, max_bytes: int) -> dict | None:
    """The --payload or --payload-file JSON object, or None when neither was given."""
    if text is not None:
        source = "--payload"
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError("--payload: is not valid UTF-8") from None
    elif path is not None:
        source = f"--payload-file {path}"
        raw = _read_limited(path, max_bytes)
    else:
        return None
    # The client checks the stored (compact) size again; this bound keeps a huge input from
    # being parsed at all.
    if len(raw) > max_bytes:
        raise UsageError(f"{source}: more than the maximum payload of {max_bytes} bytes "
                         f"(max_payload_bytes)")
    try:
        payload = json.loads(raw.decode("utf-8-sig"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise UsageError(f"{source}: is not valid UTF-8") from None
    except RecursionError:
        raise UsageError(f"{source}: JSON nested too deeply") from None
    except ValueError as exc:
        raise UsageError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean",
                type(None): "null"}.get(type(payload), "a number")
        raise UsageError(f'{source}: must be a JSON object, like {{"key": "value"}}, got {kind}: '
                         f"{_shorten(raw.decode('utf-8', 'replace'))}")
    return payload


def _read_limited(path: str, max_bytes: int) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read(max_bytes + 1)
        with open(path, "rb") as stream:
            return stream.read(max_bytes + 1)
    except OSError as exc:
        raise UsageError(f"--payload-file: cannot read {path}: {exc.strerror or exc}") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _shorten(text: str, width: int = 40) -> str:
    text = printable(text.strip())
    return text if len(text) <= width else text[:width - 3] + "..."
