"""The scheduler: enqueues the tasks of the config's schedules as their instants come due.

Every daemon runs it, with no leader: each instant is one task whose id names it
(``schedule:<name>:<instant>``), inserted through the client's own statement with ON CONFLICT
(id) DO NOTHING, so however many daemons enqueue an instant it exists once. A pass reads the
database's clock and each schedule's state (locked, so that passes of other daemons over the
same schedules wait for this one and then find its work done), decides what is due and what
was missed (supervisor/scheduling/passes.py), and inserts the tasks and the new state in one
transaction.

The thread sleeps until the next instant of any schedule (at most MAX_WAIT), and a reload
wakes it with the new schedules. A daemon without schedules never opens its connection.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Callable, Sequence

from ..client import Client, SubmittedId
from ..config import ScheduleConfig
from ..db import store
from ..logs import emit
from ..scheduling.passes import Plan, ScheduleState, next_instant, plan_pass
from .service import PeriodicService

# The longest sleep between passes, whatever the schedules: a pass costs a few statements,
# and a clock step on the database's host is noticed within this long.
MAX_WAIT = 60.0
# After a failed pass (the database is down), the next one comes this soon: the instants due
# meanwhile are still on time if it succeeds within the grace.
RETRY_WAIT = 1.0
# Waking a little after the instant, not at it: the database's now() must have reached it.
WAKE_LATE = 0.005


class Scheduler(PeriodicService):
    name_prefix = "scheduler"

    def __init__(self, dsn: str, *, schedules: Sequence[ScheduleConfig],
                 handled_types: frozenset[str] = frozenset(),
                 max_payload_bytes: int, connect_timeout: float = 5.0, pooled: bool = False,
                 on_enqueued: Callable[[str, int], None] | None = None):
        super().__init__(dsn, MAX_WAIT, connect_timeout=connect_timeout, pooled=pooled)
        self.schedules: tuple[ScheduleConfig, ...] = tuple(schedules)
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
        with conn.transaction():
            now = (now or store.database_now(conn)).astimezone(timezone.utc)
            rows = store.lock_schedule_states(conn, [s.name for s in schedules])
            plans = [plan_pass(s, _state(rows.get(s.name)), now) for s in schedules]
            # Rows are written in one order whatever the config's order, so that daemons
            # whose first passes insert the same new rows at once wait on each other, never
            # in a cycle.
            tasks = sorted((task for plan in plans for task in plan.tasks()),
                           key=lambda task: task["task_id"])
            client = Client(conn, max_payload_bytes=self.max_payload_bytes)
            ids = client.submit_many(tasks) if tasks else []
            store.save_schedule_states(conn, sorted((_row(plan) for plan in plans if plan.save),
                                                    key=lambda row: row["name"]))
        upcoming = next_instant(schedules, now)
        self._wait = MAX_WAIT if upcoming is None else min(
            MAX_WAIT, max(0.0, (upcoming - now).total_seconds()) + WAKE_LATE)
        created = [task_id for task_id in ids if task_id.created]
        self.report(plans, set(created))
        return created

    def report(self, plans: list[Plan], created: set[str]) -> None:
        """Log what changed: a start, missed instants, each task this daemon created."""
        for plan in plans:
            name = plan.schedule.name
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


def warn_unhandled(schedules: Sequence[ScheduleConfig], handled_types: frozenset[str]) -> None:
    """Once per start or reload: a schedule whose type this daemon's config does not handle
    (as for ``pgtaskd submit``, only a config that names handlers can say so)."""
    if not handled_types:
        return
    for schedule in schedules:
        if schedule.task_type not in handled_types:
            emit("schedule_type_unhandled", logging.WARNING, schedule=schedule.name,
                 task_type=schedule.task_type)


def _state(row: dict | None) -> ScheduleState | None:
    if row is None:
        return None
    return ScheduleState(row["cron"], row["timezone"], row["through"], row["last_enqueued"])


def _row(plan: Plan) -> dict:
    state = plan.state()
    return {"name": plan.schedule.name, "cron": state.cron, "timezone": state.timezone,
            "through": state.through, "last_enqueued": state.last_enqueued,
            "last_task_id": (plan.schedule.task_id(state.last_enqueued)
                             if state.last_enqueued else None)}


def _iso(instant: datetime | None) -> str | None:
    return instant.astimezone(timezone.utc).isoformat() if instant else None
