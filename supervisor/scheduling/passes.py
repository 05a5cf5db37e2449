"""What one pass of the scheduler enqueues for a schedule: the instants due, and catch-up.

Nothing here reads a clock: ``now`` is the database's, read by the caller, so tests pass the
instants they want instead of waiting for them.

Each schedule has one row of state in the database, shared by every daemon: ``through``, the
instant up to which its instants were handled. A pass at ``now`` looks at the instants in
(through, now]:

- An instant is on time while ``now - instant <= ON_TIME_GRACE``, ``now`` being the
  database's clock at the pass that considers it (the one definition: every policy uses it).
  On-time instants are always enqueued. The scheduler wakes at each instant, so on a running
  daemon every instant is on time, even when a slow database held a pass up for a few seconds.
- Older ones were missed: every daemon was down, or none could reach the database. The
  schedule's ``catch_up`` decides: ``all`` enqueues them, oldest first, but at most the newest
  ``max_catch_up``; ``latest`` only the most recent one; ``skip`` none.

Every instant passed over still moves ``through``, so it is never considered again. A
schedule seen for the first time, or whose cron or time zone differ from the ones its state
was written with, starts afresh at the pass's ``now``: its first instant is the first one
after that (the state row's creation, for a new schedule), never one from before it existed,
and a changed schedule never catches up on instants of an expression that was not in force.

A ``through`` ahead of ``now`` means the database's clock went back after a pass (or someone
wrote the row): the instants up to ``through`` were enqueued already. Within one period of
the cron plus CLOCK_TOLERANCE, the pass waits for the clock to get there, which at most
passes over one instant that ran already. Further ahead, waiting would silence the schedule
for longer than it ever rests, for a value no pass could have written on this clock: the row
is taken as corrupt and the schedule starts again at ``now``, as a new one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterable, Iterator

from ..config import ScheduleConfig

# A pass is late by a database round trip, or by the statement deadline when the database
# is slow; an outage longer than this is downtime, whose instants the catch-up policy handles.
ON_TIME_GRACE = timedelta(seconds=10)
# Datetimes count microseconds: an instant exactly ON_TIME_GRACE old is on time, and
# cron.newest() takes instants strictly after its start.
_TICK = timedelta(microseconds=1)
# How far the database's clock may go back (a correction, a failover to a host whose clock is
# behind) before a saved through is no longer waited for, on top of one period of the cron.
CLOCK_TOLERANCE = timedelta(minutes=5)


@dataclass(frozen=True)
class ScheduleState:
    """A schedule's row in pgtaskd_schedule_state."""

    cron: str
    timezone: str
    """The expression and zone ``through`` was reached with."""
    through: datetime
    """Every instant up to this one was handled: enqueued, or passed over by catch-up."""
    last_enqueued: datetime | None = None
    """The newest instant enqueued, by any daemon; None before the first."""


@dataclass(frozen=True)
class Plan:
    """What a pass does for one schedule."""

    schedule: ScheduleConfig
    instants: tuple[datetime, ...]
    """To enqueue, oldest first: the missed ones the policy keeps, then the on-time ones."""
    through: datetime
    """The state's new ``through``: the newest instant of the window, or the old value."""
    started: bool
    """No state yet, or it was written for another cron or time zone."""
    missed: int
    """How many instants were missed, counted only as far as the policy needs (at most
    max_catch_up + 1 for ``all``, 2 for ``latest``, 1 for ``skip``)."""
    caught_up: int
    """How many of the missed instants are among ``instants``."""
    save: bool
    """The state must be written: a new start, or ``through`` moved."""
    ahead: datetime | None = None
    """The saved through, when it is ahead of ``now`` and the pass waits for the clock."""
    reanchored: datetime | None = None
    """The saved through, when it was too far ahead of ``now`` to wait for: ``through`` is
    ``now`` instead, moved back."""

    def tasks(self) -> Iterator[dict[str, Any]]:
        """The instants as ``Client.submit_many`` arguments, oldest first: each task is due at
        its instant. Made one at a time, as the scheduler sends them: a catch-up may have
        thousands."""
        schedule = self.schedule
        for instant in self.instants:
            yield {"task_type": schedule.task_type, "payload": schedule.payload,
                   "priority": schedule.priority, "max_retries": schedule.max_retries,
                   "name": schedule.name, "task_id": schedule.task_id(instant),
                   "run_at": instant}

    def state(self) -> ScheduleState:
        """The state to write once the tasks are in."""
        cron = self.schedule.cron
        return ScheduleState(cron.expression, cron.timezone, self.through,
                             self.instants[-1] if self.instants else None)


def plan_pass(schedule: ScheduleConfig, state: ScheduleState | None, now: datetime, *,
              grace: timedelta = ON_TIME_GRACE) -> Plan:
    """The instants of ``schedule`` to enqueue at ``now``, given its state in the database."""
    cron = schedule.cron
    started = state is None or (state.cron, state.timezone) != (cron.expression, cron.timezone)
    through = now if started else state.through
    ahead = reanchored = None
    if through > now:
        if clock_behind(cron, through, now) == "waits":
            ahead = through
        else:
            reanchored, through = through, now
    cutoff = now - grace - _TICK  # the newest instant that is missed
    on_time = cron.newest(max(through, cutoff), now)
    missed = cron.newest(through, cutoff, _needed(schedule)) if through < cutoff else []
    if schedule.catch_up == "all":
        kept = missed[-schedule.max_catch_up:]
    elif schedule.catch_up == "latest":
        kept = missed[-1:]
    else:
        kept = []
    window = missed + on_time
    new_through = window[-1] if window else through
    return Plan(schedule=schedule, instants=tuple(kept + on_time), through=new_through,
                started=started, missed=len(missed), caught_up=len(kept),
                save=started or reanchored is not None or new_through != through,
                ahead=ahead, reanchored=reanchored)


def clock_behind(cron, through: datetime, now: datetime) -> str | None:
    """What a pass at ``now`` does with a saved ``through``: None if it is not ahead,
    ``waits`` while it is within one period of the cron (between its next two instants) plus
    CLOCK_TOLERANCE, ``reanchors`` (starts again at now) if it is further."""
    if through <= now:
        return None
    first = cron.next_after(now)
    second = cron.next_after(first) if first is not None else None
    period = second - first if second is not None else timedelta(0)
    return "waits" if through - now <= period + CLOCK_TOLERANCE else "reanchors"


def _needed(schedule: ScheduleConfig) -> int:
    """How many of the newest missed instants the policy must see: one more than it keeps,
    to know whether it left some out."""
    return {"all": schedule.max_catch_up, "latest": 1, "skip": 0}[schedule.catch_up] + 1


def next_instant(schedules: Iterable[ScheduleConfig], now: datetime) -> datetime | None:
    """The earliest instant after ``now`` of any of these schedules; None if none has one."""
    upcoming = [instant for schedule in schedules
                if (instant := schedule.cron.next_after(now)) is not None]
    return min(upcoming, default=None)
