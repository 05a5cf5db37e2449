"""The scheduler: enqueues the tasks of the config's schedules as their instants come due.

Every daemon runs it, with no leader: each instant is one task whose id names it
(``schedule:<name>:<instant>``), inserted through the client's own statement with ON CONFLICT
(id) DO NOTHING, so however many daemons enqueue an instant it exists once. A pass reads the
database's clock and each schedule's state (locked, so that passes of other daemons over the
same schedules wait for this one and then find its work done), decides what is due and what
was missed (supervisor/scheduling/passes.py), and inserts the tasks and the new state in one
transaction: all of a pass's instants and the state that says they were handled commit together
or not at all, so a pass cut short (a crash, a lost connection) leaves the next one to insert
them again, and their ids make any that did land count once. The tasks go in as statements of
bounded size within that transaction, made as they are sent, so a catch-up of thousands of
instants never holds them all at once.

Daemons whose configs give one schedule name different definitions do not mix them: only a
daemon whose definition is the one the state row records enqueues (the rule is in
supervisor/scheduling/definitions.py); each pass reports this daemon's definitions, and a
disagreement is logged by every daemon that sees it, once per change.

The thread sleeps until the next instant of any schedule (at most MAX_WAIT), and a reload
wakes it with the new schedules. A daemon without schedules never opens its connection.
"""

from __future__ import annotations

import heapq
import logging
import os
import socket
from datetime import datetime, timedelta, timezone
from operator import itemgetter
from typing import Any, Callable, Iterator, Sequence

from ..client import Client, SubmittedId, prepare_task
from ..client.submit import encoded_size
from ..config import ScheduleConfig
from ..db import schedule_states, store
from ..logs import emit
from ..scheduling.definitions import Report, Verdict, decide, definition_of
from ..scheduling.passes import CLOCK_TOLERANCE, Plan, ScheduleState, next_instant, plan_pass
from .service import PeriodicService

# The longest sleep between passes, whatever the schedules: a pass costs a few statements,
# and a clock step on the database's host is noticed within this long.
MAX_WAIT = 60.0
# After a failed pass (the database is down), the next one comes this soon: the instants due
# meanwhile are still on time if it succeeds within the grace.
RETRY_WAIT = 1.0
# Waking a little after the instant, not at it: the database's now() must have reached it.
WAKE_LATE = 0.005
# Reports of a daemon not seen for this long are deleted (they stopped mattering long before).
FORGET_REPORTS = timedelta(days=1)
# A pass inserts its tasks in statements of at most this many tasks and this many bytes of
# JSON (a task larger than that goes alone). One statement for a whole catch-up held each
# task's JSON several times over at once (prepared, joined into the array, encoded): 10,000
# instants of a 20 KB payload peaked at 826 MB of RSS, kept 390 MB, and took 6-10 s against
# the 10 s statement timeout (once past it, and a pass that fails fails again). 500 keeps
# small tasks to 20 statements per 10,000; 4 MiB keeps what a statement holds to a few tens
# of MiB whatever max_payload_bytes allows.
MAX_INSERT_TASKS = 500
MAX_INSERT_BYTES = 4 << 20


class Scheduler(PeriodicService):
    name_prefix = "scheduler"

    def __init__(self, dsn: str, *, schedules: Sequence[ScheduleConfig],
                 handled_types: frozenset[str] = frozenset(),
                 max_payload_bytes: int, connect_timeout: float = 5.0, pooled: bool = False,
                 on_enqueued: Callable[[str, int], None] | None = None,
                 daemon: str | None = None):
        super().__init__(dsn, MAX_WAIT, connect_timeout=connect_timeout, pooled=pooled)
        self.schedules: tuple[ScheduleConfig, ...] = tuple(schedules)
        # Who this daemon is in the reports: its host and config file (services.py).
        self.daemon = daemon or f"{socket.gethostname()}:{os.getpid()}"
        # Schedule name -> this daemon's definition at its last pass: a reload that changes
        # the recorded definition carries the schedule with it.
        self._previous: dict[str, str] = {}
        # The names whose state row this scheduler saw, so a pass creates only the others.
        self._known: set[str] = set()
        # Schedule name -> the disagreement last logged, so each is logged once.
        self._conflicts: dict[str, tuple] = {}
        # Schedule name -> the saved through found ahead of the clock, logged once until the
        # clock reaches it.
        self._ahead: dict[str, datetime] = {}
        self.max_payload_bytes = max_payload_bytes
        self.on_enqueued = on_enqueued or (lambda name, count: None)
        self._wait = 0.0
        warn_unhandled(self.schedules, handled_types)

    def apply(self, schedules: Sequence[ScheduleConfig], handled_types: frozenset[str],
              max_payload_bytes: int) -> None:
        """A reload's schedules: the next pass (at once) enqueues only these. A removed
        schedule's tasks stay as they are; a changed one starts afresh."""
        schedules = tuple(schedules)
        if schedules != self.schedules:
            emit("schedules_applied", schedules=[s.name for s in schedules])
        warn_unhandled(schedules, handled_types)
        self.max_payload_bytes = max_payload_bytes
        self.schedules = schedules  # replaced whole: a pass keeps the tuple it began with
        self.wake()

    def next_wait(self) -> float:
        return self._wait

    def on_failure(self, exc: BaseException) -> None:
        self._wait = RETRY_WAIT

    def tick(self) -> None:
        if not self.schedules:
            self._close()  # all removed by a reload: no connection to keep open
            self._wait = MAX_WAIT
            return
        super().tick()

    def run_once(self, now: datetime | None = None) -> list[SubmittedId]:
        """Enqueue what is due at ``now`` (the database's clock unless given); the ids this
        pass created (an id another daemon created first is not among them)."""
        schedules = self.schedules
        if not schedules:
            return []
        conn = self.connection()
        mine = {s.name: definition_of(s) for s in schedules}
        self._create_states([s for s in schedules if s.name not in self._known], mine, now)
        with conn.transaction():
            now = (now or store.database_now(conn)).astimezone(timezone.utc)
            rows = schedule_states.lock_schedule_states(conn, [s.name for s in schedules])
            reports = schedule_states.schedule_reports(conn, [s.name for s in schedules])
            verdicts: dict[str, Verdict] = {}
            plans = []
            for schedule in schedules:
                row = rows.get(schedule.name)
                if row is None:  # deleted since: the next pass creates it again
                    self._known.discard(schedule.name)
                    continue
                verdict = verdicts[schedule.name] = self._decide(
                    schedule.name, mine[schedule.name], row, reports.get(schedule.name, []), now)
                if verdict.enqueues:
                    plans.append(plan_pass(schedule, _state(row, now), now))
            created = self._insert(conn, plans)
            saved = [_row(plan, mine[plan.schedule.name]) for plan in plans
                     if plan.save or verdicts[plan.schedule.name].replaces
                     or rows[plan.schedule.name]["through"] is None]
            schedule_states.save_schedule_states(conn, sorted(saved, key=lambda r: r["name"]),
                                                 now)
            schedule_states.report_definitions(
                conn, self.daemon, {name: mine[name] for name in verdicts}, now,
                now - FORGET_REPORTS)
        self._previous.update({name: mine[name] for name in verdicts})
        upcoming = next_instant(schedules, now)
        self._wait = MAX_WAIT if upcoming is None else min(
            MAX_WAIT, max(0.0, (upcoming - now).total_seconds()) + WAKE_LATE)
        self.report_definitions(schedules, verdicts, rows, mine)
        self.report(plans, set(created), now)
        return created

    def _insert(self, conn, plans: list[Plan]) -> list[SubmittedId]:
        """Insert the plans' tasks in the caller's transaction; the ids created, in task id
        order."""
        client = Client(conn, max_payload_bytes=self.max_payload_bytes)
        created: list[SubmittedId] = []
        for statement in _statements(plans, self.max_payload_bytes):
            created += [task_id for task_id in client.submit_many(statement) if task_id.created]
        return created

    def _create_states(self, new: list[ScheduleConfig], mine: dict[str, str],
                       now: datetime | None) -> None:
        """Rows for schedules this scheduler has not seen yet, committed on their own: a
        new schedule starts at this moment, with this daemon's definition unless another
        daemon's row came first."""
        if not new:
            return
        conn = self.connection()
        created_at = (now or store.database_now(conn)).astimezone(timezone.utc)
        started = schedule_states.create_schedule_states(conn, [
            {"name": s.name, "definition": mine[s.name], "cron": s.cron.expression,
             "timezone": s.cron.timezone} for s in new], created_at)
        self._known.update(s.name for s in new)
        for schedule in new:
            if schedule.name in started:
                emit("schedule_started", schedule=schedule.name, cron=schedule.cron.expression,
                     timezone=schedule.cron.timezone,
                     next_run=_iso(schedule.cron.next_after(created_at)))

    def _decide(self, name: str, mine: str, row: dict, rows: list[dict],
                now: datetime) -> Verdict:
        reports = [Report(r["daemon"], r["definition"], r["seen_at"]) for r in rows
                   if r["seen_at"] is not None]
        if name in self._previous:
            previous = self._previous[name]
        else:  # first pass since the start: what this daemon (host and config) said last
            previous = next((r.definition for r in reports if r.daemon == self.daemon), None)
        # An unreadable time says nothing of who holds the definition: as old as can be.
        recorded_at = row["updated_at"] or datetime.min.replace(tzinfo=timezone.utc)
        return decide(mine, row["definition"], previous=previous, recorded_at=recorded_at,
                      reports=reports, me=self.daemon, now=now)

    def report_definitions(self, schedules: Sequence[ScheduleConfig],
                           verdicts: dict[str, Verdict], rows: dict[str, dict],
                           mine: dict[str, str]) -> None:
        """Log a replaced definition, and each disagreement once per change, on the daemon
        kept out and on the ones that enqueue alike."""
        for schedule in schedules:
            name = schedule.name
            verdict = verdicts.get(name)
            if verdict is None:
                continue
            recorded = rows[name]["definition"]
            if verdict.replaces in ("changed", "abandoned"):
                emit("schedule_definition_replaced",
                     logging.WARNING if verdict.replaces == "abandoned" else logging.INFO,
                     schedule=name, reason=verdict.replaces, definition=_short(mine[name]),
                     previous=_short(recorded))
            if verdict.enqueues:
                key = (("holding", frozenset((r.daemon, r.definition)
                                             for r in verdict.disagreeing))
                       if verdict.disagreeing else None)
            else:
                key = ("kept out", recorded)
            if key == self._conflicts.get(name):
                continue
            if key is None:
                self._conflicts.pop(name, None)
                emit("schedule_conflict_resolved", schedule=name, definition=_short(mine[name]))
                continue
            self._conflicts[name] = key
            emit("schedule_conflict", logging.WARNING, schedule=name, enqueues=verdict.enqueues,
                 definition=_short(mine[name]),
                 recorded=_short(mine[name] if verdict.enqueues else recorded),
                 daemons=sorted({r.daemon for r in verdict.disagreeing}),
                 action=("this daemon enqueues it; the daemons listed have another definition "
                         "and enqueue nothing for it" if verdict.enqueues else
                         "this daemon enqueues nothing for it until its definition matches "
                         "the recorded one (make the configs agree)"))

    def report(self, plans: list[Plan], created: set[str], now: datetime) -> None:
        """Log what changed: a start, missed instants, each task this daemon created, a
        through ahead of the clock."""
        for plan in plans:
            name = plan.schedule.name
            self._report_clock(plan, now)
            if plan.started:
                emit("schedule_started", schedule=name, cron=plan.schedule.cron.expression,
                     timezone=plan.schedule.cron.timezone,
                     next_run=_iso(plan.schedule.cron.next_after(plan.through)))
            if plan.missed:
                # ``missed`` is counted only as far as the policy looks: "at least".
                emit("schedule_missed", logging.WARNING, schedule=name,
                     catch_up=plan.schedule.catch_up, missed_at_least=plan.missed,
                     caught_up=plan.caught_up)
            mine = [i for i in plan.instants if plan.schedule.task_id(i) in created]
            for instant in mine:
                emit("schedule_enqueued", schedule=name, task_id=plan.schedule.task_id(instant),
                     task_type=plan.schedule.task_type, instant=_iso(instant))
            if mine:
                self.on_enqueued(name, len(mine))

    def _report_clock(self, plan: Plan, now: datetime) -> None:
        name = plan.schedule.name
        if plan.reanchored is not None:
            emit("schedule_reanchored", logging.WARNING, schedule=name,
                 through=_iso(plan.reanchored), database_now=_iso(now),
                 ahead_seconds=round((plan.reanchored - now).total_seconds(), 3),
                 action="the saved through is more than one period of the cron plus "
                        f"{_minutes(CLOCK_TOLERANCE)} ahead of the database clock, so it is "
                        "taken as corrupt: the schedule starts again at the database clock, "
                        f"its next instant is {_iso(plan.schedule.cron.next_after(now))}")
        if plan.ahead is not None:
            if self._ahead.get(name) != plan.ahead:
                self._ahead[name] = plan.ahead
                emit("schedule_ahead_of_clock", logging.WARNING, schedule=name,
                     through=_iso(plan.ahead), database_now=_iso(now),
                     ahead_seconds=round((plan.ahead - now).total_seconds(), 3),
                     action="the database clock is behind the instant this schedule was "
                            "enqueued through (it went back, or the row was written by "
                            "hand): the schedule waits, enqueueing nothing until the clock "
                            "passes it; the instants up to it were enqueued already")
        elif self._ahead.pop(name, None) is not None:
            emit("schedule_clock_caught_up", schedule=name, database_now=_iso(now))


def warn_unhandled(schedules: Sequence[ScheduleConfig], handled_types: frozenset[str]) -> None:
    """Once per start or reload: a schedule whose type this daemon's config does not handle
    (as for ``pgtaskd submit``, only a config that names handlers can say so)."""
    if not handled_types:
        return
    for schedule in schedules:
        if schedule.task_type not in handled_types:
            emit("schedule_type_unhandled", logging.WARNING, schedule=schedule.name,
                 task_type=schedule.task_type)


def _statements(plans: list[Plan], max_payload_bytes: int) -> Iterator[list[dict[str, Any]]]:
    """The plans' tasks cut into statements of at most MAX_INSERT_TASKS tasks and
    MAX_INSERT_BYTES bytes, each made only when the one before it was sent.

    Rows are written in task id order whatever the config's order, so that daemons whose
    passes write the same rows at once wait on each other, never in a cycle: each plan's
    tasks come in that order already (its ids differ only by a fixed-width instant), so a
    merge orders them all without holding them."""
    statement: list[dict[str, Any]] = []
    size = 0
    for _, task_size, task in heapq.merge(*(_sized(plan, max_payload_bytes) for plan in plans),
                                          key=itemgetter(0)):
        if statement and (len(statement) == MAX_INSERT_TASKS
                          or size + task_size > MAX_INSERT_BYTES):
            yield statement
            statement, size = [], 0
        statement.append(task)
        size += task_size
    if statement:
        yield statement


def _sized(plan: Plan, max_payload_bytes: int) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(task id, encoded size, task) of each of the plan's tasks. They all have the first
    one's size: one payload, and ids and times of one width."""
    tasks = plan.tasks()
    first = next(tasks, None)
    if first is None:
        return
    size = encoded_size(prepare_task(**first, max_payload_bytes=max_payload_bytes))
    yield first["task_id"], size, first
    for task in tasks:
        yield task["task_id"], size, task


def _state(row: dict, now: datetime) -> ScheduleState:
    # A through no datetime holds was written by hand: start afresh from now rather than
    # guess what it meant (cron and zone kept, so no other column changes).
    return ScheduleState(row["cron"], row["timezone"], row["through"] or now,
                         row["last_enqueued"])


def _row(plan: Plan, definition: str) -> dict:
    state = plan.state()
    return {"name": plan.schedule.name, "definition": definition,
            "cron": state.cron, "timezone": state.timezone,
            "through": state.through, "last_enqueued": state.last_enqueued,
            "last_task_id": (plan.schedule.task_id(state.last_enqueued)
                             if state.last_enqueued else None),
            "reset": plan.reanchored is not None}


def _minutes(duration: timedelta) -> str:
    return f"{duration.total_seconds() / 60:g} min"


def _iso(instant: datetime | None) -> str | None:
    return instant.astimezone(timezone.utc).isoformat() if instant else None


def _short(definition: str | None) -> str | None:
    """Enough of a definition's hash to tell two apart in a log line."""
    return definition[:12] if definition else None
