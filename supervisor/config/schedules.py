"""The schedules section: periodic tasks, their cron expressions and time zones.

Each schedule's task goes through the same checks as a client's submit when the file loads, so
that a task the client would refuse at every instant is a config problem instead.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Mapping

from ..errors import UsageError, quote
from ..scheduling.cron import HORIZON_YEARS, Cron, CronError, check_expression, load_zone
from ..task_fields import INT32_MAX, INT32_MIN, prepare_task
from .defaults import (CATCH_UP_POLICIES, DEFAULT_CATCH_UP, DEFAULT_MAX_CATCH_UP,
                       DEFAULT_SCHEDULE_TIMEZONE, MAX_CATCH_UP_LIMIT)
from .model import ScheduleConfig, schedule_task_id
from .validator import Validator, shown_key, type_name

# A schedule's name is part of its tasks' ids (schedule:<name>:<instant>): no colon, and short
# enough that every id stays within the client's 200 characters.
_SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
# Every instant's id has the same length; this one stands for all of them.
_ANY_INSTANT = datetime(2000, 1, 1, tzinfo=timezone.utc)


_SCHEDULE_KEYS = {"cron", "timezone", "task_type", "payload", "priority", "max_retries",
                  "catch_up", "max_catch_up"}


def parse_schedules(v: Validator, tree: Mapping,
                    max_payload_bytes: int) -> tuple[ScheduleConfig, ...]:
    raw = tree.get("schedules")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        v.problem("schedules", f"must be a mapping of schedule name to settings, "
                               f"got {type_name(raw)}")
        return ()
    schedules = []
    for name, settings in raw.items():
        where = f"schedules.{shown_key(name)}"
        if not isinstance(name, str) or not _SCHEDULE_NAME.match(name):
            v.problem(where, "a schedule name must be 1-100 letters, digits, '_', '-' or '.'")
            continue
        if not isinstance(settings, dict):
            v.problem(where, f"must be a mapping with at least cron and task_type, "
                             f"got {type_name(settings)}")
            continue
        v.unknown(settings, where, _SCHEDULE_KEYS)
        schedule = _parse_schedule(v, name, settings, where, max_payload_bytes)
        if schedule is not None:
            schedules.append(schedule)
    return tuple(schedules)


def _parse_schedule(v: Validator, name: str, settings: Mapping, where: str,
                    max_payload_bytes: int) -> ScheduleConfig | None:
    before = len(v.problems)
    cron = _parse_cron(v, settings, where)
    task_type = settings.get("task_type")
    if task_type is None:
        v.problem(f"{where}.task_type", "is required: the type of the tasks to enqueue")
    payload = settings.get("payload")
    if payload is None:
        payload = {}
    elif not isinstance(payload, dict):
        v.problem(f"{where}.payload", f"must be a mapping (a JSON object), "
                                      f"got {type_name(payload)}")
    catch_up = settings.get("catch_up", DEFAULT_CATCH_UP)
    if catch_up is None:
        catch_up = DEFAULT_CATCH_UP
    if catch_up not in CATCH_UP_POLICIES:
        v.problem(f"{where}.catch_up", f"must be one of {', '.join(CATCH_UP_POLICIES)}, "
                                       f"got {quote(catch_up)}")
    schedule = dict(
        name=name, cron=cron, task_type=task_type, payload=payload,
        priority=v.integer(settings, "priority", where, 0, minimum=INT32_MIN, maximum=INT32_MAX),
        max_retries=v.integer(settings, "max_retries", where, 3, minimum=0, maximum=INT32_MAX),
        catch_up=catch_up,
        max_catch_up=v.integer(settings, "max_catch_up", where, DEFAULT_MAX_CATCH_UP, minimum=1,
                               maximum=MAX_CATCH_UP_LIMIT))
    if task_type is not None and isinstance(payload, dict):
        _check_schedule_task(v, schedule, where, max_payload_bytes)
    if len(v.problems) > before:
        return None
    return ScheduleConfig(**schedule)


def _check_schedule_task(v: Validator, schedule: dict, where: str,
                         max_payload_bytes: int) -> None:
    """The tasks go in through the client's own checks at every instant: the same checks now
    make a task type or a payload it would refuse a config problem, not a failing service."""
    try:
        prepare_task(schedule["task_type"], schedule["payload"], priority=schedule["priority"],
                     max_retries=schedule["max_retries"], name=schedule["name"],
                     task_id=schedule_task_id(schedule["name"], _ANY_INSTANT),
                     max_payload_bytes=max_payload_bytes)
    except UsageError as exc:
        field_name, _, reason = str(exc).partition(": ")
        if field_name in ("task_type", "payload"):
            v.problem(f"{where}.{field_name}", reason)
        else:
            v.problem(where, str(exc))


def _parse_cron(v: Validator, settings: Mapping, where: str) -> Cron | None:
    expression = settings.get("cron")
    zone_name = settings.get("timezone")
    if zone_name is None:
        zone_name = DEFAULT_SCHEDULE_TIMEZONE
    valid = True
    try:
        load_zone(zone_name)
    except CronError as exc:
        v.problem(f"{where}.timezone", str(exc))
        valid = False
    if expression is None:
        v.problem(f"{where}.cron", "is required: a cron expression, like '30 2 * * *'")
        return None
    try:
        check_expression(expression)
    except CronError as exc:
        v.problem(f"{where}.cron", f"{exc}, got {quote(expression)}")
        return None
    if not valid:
        return None
    cron = Cron(expression, zone_name)
    # cronsim checked that the expression names a date; whether its zone's clock ever shows
    # one of its wall times (not all in a skipped hour) only the placed search can tell.
    if cron.next_after(datetime.now(timezone.utc)) is None:
        v.problem(f"{where}.cron", f"names no instant in the next {HORIZON_YEARS} years in "
                                   f"{zone_name} (each time it names falls where the clock "
                                   f"skips, as at a change to daylight saving time), "
                                   f"got {quote(expression)}")
        return None
    return cron
