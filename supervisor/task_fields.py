"""The fields of a new task, checked before anything is written: what a submit may ask for.

The client checks every submit with ``prepare_task``, and the config checks each schedule's
task with it when the file loads, so that a task a schedule would enqueue and the client
would refuse is a config problem, not a failing service. The limits that protect the
database (index-sized ids, INTEGER columns, the payload size) live here with the checks.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from .errors import UsageError, quote

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_TASK_TYPE_LENGTH = 200
# The range of PostgreSQL's INTEGER, which priority and max_retries are stored as.
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
SUBMIT_FIELDS = frozenset({"task_type", "payload", "priority", "run_at", "delay", "task_id",
                           "name", "max_retries", "unique_key"})
# Ids and task types are indexed; PostgreSQL refuses btree entries over about 2.7 kB, so a
# bound in characters (at most 4 bytes each) keeps every accepted value indexable.
MAX_ID_LENGTH = 200
MAX_UNIQUE_KEY_LENGTH = 200
MAX_NAME_LENGTH = 1000
MAX_PAUSED_BY_LENGTH = 200
# Far enough for any real schedule, near enough that now() + delay never leaves the range
# of a timestamp.
MAX_DELAY_SECONDS = 100 * 365 * 86400


@dataclass(frozen=True)
class NewTask:
    """One task to submit, checked and with its payload already serialized."""
    id: str
    name: str
    task_type: str
    payload_json: str
    priority: int
    run_at: datetime | None
    delay_seconds: float | None
    max_retries: int
    unique_key: str | None = None


def prepare_task(task_type: str, payload: Mapping[str, Any] | None = None, *,
                 priority: int = 0, run_at: datetime | None = None,
                 delay: float | timedelta | None = None, task_id: str | None = None,
                 name: str | None = None, max_retries: int = 3,
                 unique_key: str | None = None,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> NewTask:
    """Check every argument of a submit; UsageError names the first bad one."""
    task_type = check_task_type(task_type)
    task_id = str(uuid.uuid4()) if task_id is None else check_label("task_id", task_id,
                                                                    MAX_ID_LENGTH)
    if unique_key is not None:
        unique_key = check_label("unique_key", unique_key, MAX_UNIQUE_KEY_LENGTH)
    if name is None:
        name = task_type
    else:
        check_text("name", name)
        if len(name) > MAX_NAME_LENGTH:
            raise UsageError(f"name: longer than {MAX_NAME_LENGTH} characters")
    if run_at is not None and delay is not None:
        raise UsageError("give run_at or delay, not both")
    return NewTask(
        id=task_id, name=name, task_type=task_type,
        payload_json=serialize_payload(payload, max_payload_bytes),
        priority=check_int("priority", priority, INT32_MIN, INT32_MAX),
        run_at=None if run_at is None else _check_run_at(run_at),
        delay_seconds=None if delay is None else _check_delay(delay),
        max_retries=check_int("max_retries", max_retries, 0, INT32_MAX),
        unique_key=unique_key,
    )


# Built once: json.dumps with options builds a new encoder on every call.
_PAYLOAD_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def serialize_payload(payload: Mapping[str, Any] | None, max_bytes: int) -> str:
    """Compact JSON text of a payload that PostgreSQL's jsonb will accept, within max_bytes."""
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise UsageError(f"payload: must be a JSON object (a dict), got {kind_of(payload)}")
    try:
        text = _PAYLOAD_ENCODER.encode(dict(payload))
    except RecursionError:
        raise UsageError("payload: nested too deeply") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"payload: cannot be stored as JSON: {exc}") from None
    # Only now: json.dumps has ruled out cycles, which the walk would follow forever.
    _check_storable(payload)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise UsageError("payload: contains text that is not valid Unicode") from None
    if size > max_bytes:
        raise UsageError(f"payload: {size} bytes, more than the maximum of {max_bytes} "
                         f"(max_payload_bytes)")
    return text


def _check_storable(payload: Mapping) -> None:
    """Reject what json.dumps lets through but jsonb refuses, or silently changes."""
    pending: list[Any] = [payload]
    while pending:
        value = pending.pop()
        if isinstance(value, Mapping):
            for key, item in value.items():
                # json.dumps would turn 1 and "1" into the same key, and keep both.
                if not isinstance(key, str):
                    raise UsageError(f"payload: object keys must be strings, "
                                     f"got {kind_of(key)} {quote(key)}")
                pending.extend((key, item))
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif isinstance(value, str) and "\x00" in value:
            raise UsageError("payload: text must not contain NUL characters (\\u0000)")


def check_text(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{field}: must be a string, got {kind_of(value)}")
    if "\x00" in value:
        raise UsageError(f"{field}: must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{field}: is not valid Unicode") from None
    return value


def check_label(field: str, value: Any, max_length: int) -> str:
    """An id or a task type: shown in tables, typed by operators, indexed."""
    check_text(field, value)
    if not value:
        raise UsageError(f"{field}: must not be empty")
    if len(value) > max_length:
        raise UsageError(f"{field}: longer than {max_length} characters")
    if value != value.strip():
        raise UsageError(f"{field}: must not start or end with white space, got {quote(value)}")
    if not value.isprintable():
        raise UsageError(f"{field}: must not contain control or format characters, "
                         f"got {quote(value)}")
    return value


def check_task_type(value: Any) -> str:
    """The one rule for a task type's name, for a submit and for every type a config names:
    a type the client could not submit would be a handler no task reaches, or a pool whose
    every claim fails."""
    return check_label("task_type", value, MAX_TASK_TYPE_LENGTH)


def check_int(field: str, value: Any, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{field}: must be a whole number, got {kind_of(value)} {quote(value)}")
    if value < minimum:
        raise UsageError(f"{field}: must be {minimum} or more, got {quote(value)}")
    if value > maximum:
        raise UsageError(f"{field}: must be at most {maximum}, got {quote(value)}")
    return value


def _check_run_at(run_at: Any) -> datetime:
    if not isinstance(run_at, datetime):
        raise UsageError(f"run_at: must be a datetime, got {kind_of(run_at)}")
    return aware_utc("run_at", run_at)


def aware_utc(field: str, moment: datetime) -> datetime:
    """An aware datetime in UTC, or UsageError naming ``field``: a naive one has no place
    on the database's clock."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise UsageError(f"{field}: {moment.isoformat()} has no time zone; give an aware "
                         f"datetime (like datetime.now(timezone.utc))")
    try:
        # A time that cannot be read back as a Python datetime could not be shown later.
        return moment.astimezone(timezone.utc)
    except OverflowError:
        raise UsageError(f"{field}: {moment.isoformat()} is out of range") from None


def _check_delay(delay: Any) -> float:
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise UsageError(f"delay: must be seconds or a timedelta, got {kind_of(delay)}")
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DELAY_SECONDS:
        raise UsageError(f"delay: must be from 0 to {MAX_DELAY_SECONDS} seconds, "
                         f"got {quote(delay)}")
    return seconds


def kind_of(value: Any) -> str:
    """What a value is, in the words of JSON, for a message about a bad input."""
    return {dict: "an object", list: "a list", tuple: "a list", str: "a string",
            bool: "a boolean", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)
