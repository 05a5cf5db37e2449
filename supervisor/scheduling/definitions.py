"""Which daemon's definition of a schedule is in force when their configs disagree.

A schedule is shared by name: every daemon whose config names it enqueues its instants. Two
configs may give the same name different definitions (another task type, cron, payload...);
enqueueing each daemon's own would mix them instant by instant. So the schedule's state row
records one definition, a hash of everything that shapes its tasks, and only a daemon whose
definition matches it enqueues. The rule:

- The first definition recorded keeps the schedule. A daemon with another one enqueues
  nothing for it, says so (``schedule_conflict``) and waits for the configs to agree.
- A daemon that held the recorded definition and then changed it (a reload, or a restart
  of the same host and config file) replaces it: that is a deploy, and it may reach the
  daemons in any order. The daemons not reached yet are the ones that now disagree, until
  they are.
- A definition that no daemon has reported for TAKEOVER_AFTER is abandoned (its daemons
  were all stopped, or all moved to another one by restarts on other hosts); the next daemon
  with another definition takes the schedule.

Nothing here reads a clock or the database: the scheduler passes what it read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..config import ScheduleConfig

# The scheduler passes at least every MAX_WAIT (60 s), each pass reporting its definitions:
# five minutes without one means no daemon holding that definition is running its scheduler.
TAKEOVER_AFTER = timedelta(minutes=5)


def definition_of(schedule: ScheduleConfig) -> str:
    """A hash of what makes the schedule's tasks: the same on every host for the same YAML,
    whatever the order of its keys."""
    shape = {"cron": schedule.cron.expression, "timezone": schedule.cron.timezone,
             "task_type": schedule.task_type, "payload": schedule.payload,
             "priority": schedule.priority, "max_retries": schedule.max_retries,
             "catch_up": schedule.catch_up, "max_catch_up": schedule.max_catch_up}
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Report:
    """One daemon's definition of a schedule, as of its latest pass."""

    daemon: str
    definition: str
    seen_at: datetime


@dataclass(frozen=True)
class Verdict:
    enqueues: bool
    """This daemon's definition is the one in force (after ``replaces``, if set)."""
    replaces: str | None
    """Why this daemon writes its definition into the row: ``adopted`` (a row from before
    definitions were recorded), ``changed`` (its daemon held the recorded one),
    ``abandoned`` (nobody held the recorded one for TAKEOVER_AFTER); None if it does not."""
    disagreeing: tuple[Report, ...]
    """Daemons seen within TAKEOVER_AFTER whose definition is not the one in force."""


def decide(mine: str, recorded: str | None, *, previous: str | None,
           recorded_at: datetime, reports: list[Report], me: str, now: datetime) -> Verdict:
    """What this daemon does for one schedule.

    ``previous``: this daemon's definition at its last pass (or, on the first pass after a
    start, the one the table has from this daemon). ``recorded_at``: when the row's
    definition was last written (a definition is held from then on, even before the first
    report of the daemon that wrote it). ``reports``: every daemon's latest report."""
    recent = [r for r in reports if r.seen_at > now - TAKEOVER_AFTER and r.daemon != me]
    if recorded is None:
        replaces = "adopted"
    elif mine == recorded:
        replaces = None
    elif previous == recorded:
        replaces = "changed"
    elif (recorded_at <= now - TAKEOVER_AFTER
          and not any(r.definition == recorded for r in recent)):
        replaces = "abandoned"
    else:
        return Verdict(False, None, tuple(r for r in recent if r.definition != recorded))
    return Verdict(True, replaces, tuple(r for r in recent if r.definition != mine))
