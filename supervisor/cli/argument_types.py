"""The argparse value types of the ``pgtaskd`` arguments: durations, timestamps, limits, counts.

Each refuses a value with a message that quotes what was typed; the parser turns it into one
usage line and exit status 2.
"""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timedelta

from ..config import MAX_LIMIT
from ..errors import quote
from ..task_fields import MAX_DELAY_SECONDS

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``30s``, ``5m``, ``2h``, ``1d`` or plain ``90`` (an argparse type)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(
            f"cannot read {quote(text)} as a duration (like 30s, 5m, 2h, 1d, or seconds)")
    return float(match[1]) * _DURATION_UNITS[match[2]]


def parse_when(text: str) -> datetime | timedelta:
    """A moment for a filter (an argparse type): a duration back from now (``1h``, ``7d``, a
    timedelta the client counts from the database's clock) or an ISO-8601 timestamp that
    names its time zone."""
    if _DURATION.fullmatch(text.strip().lower()):
        return parse_age(text)
    try:
        return parse_timestamp(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"cannot read {quote(text)} as a duration back from now (like 30m, 2h, 7d) or "
            f"an ISO-8601 time with its zone (like 2026-01-31T09:00:00Z)") from None


def parse_age(text: str) -> timedelta:
    """``--older-than``: a duration back from now (an argparse type)."""
    seconds = parse_duration(text)
    if seconds > MAX_DELAY_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{quote(text)} is more than {MAX_DELAY_SECONDS // 86400} days")
    return timedelta(seconds=seconds)


def parse_timestamp(text: str) -> datetime:
    """An ISO-8601 timestamp that names its time zone (an argparse type)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cannot read {quote(text)} as an ISO-8601 timestamp "
            f"(like 2026-01-31T09:00:00+01:00 or 2026-01-31T08:00:00Z)") from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"{quote(text)} has no time zone: add an offset, like Z or +01:00")
    return moment


def limit_value(text: str) -> int | None:
    """N of ``pgtaskd limit TYPE N`` (an argparse type): None for 'off'."""
    if text.strip().lower() == "off":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_LIMIT}, or "
                                         f"'off', got {quote(text)}")
    return value


def int_at_least(minimum: int):
    """An argparse type: a whole number no smaller than ``minimum``."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{quote(text)} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return convert


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)

MAX_LIST_ITEMS = 16


def positive_int_list(text: str) -> tuple[int, ...]:
    """An argparse type: ``1,2,4,8``, whole numbers of at least 1, each once, rising."""
    values = []
    for item in text.split(","):
        try:
            value = int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{quote(item)} in {quote(text)} is not a whole "
                                             f"number") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be at least 1, got {value} in {quote(text)}")
        values.append(value)
    if values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"must rise, each number once, got {quote(text)}")
    if len(values) > MAX_LIST_ITEMS:
        raise argparse.ArgumentTypeError(f"at most {MAX_LIST_ITEMS} numbers, got {len(values)}")
    return tuple(values)


MAX_WORK_MS = 60_000.0


def work_milliseconds(text: str) -> float:
    """``--work-ms`` of the bench (an argparse type): finite, from 0 to a minute."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_WORK_MS:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be a number of milliseconds from 0 to "
                                         f"{MAX_WORK_MS:,.0f}, got {quote(text)}")
    return value
