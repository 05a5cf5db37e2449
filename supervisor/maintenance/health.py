"""The health check: what a process status cannot show.

Every few seconds: can the daemon reach PostgreSQL; how many due tasks waited longer than
``health.max_pending_age``; how many leases expired and stayed unreaped; how many children
live against the configured count. The latest report feeds /healthz and the queue gauges.

Tasks of a paused type wait because an operator said so: they never fail the pending-age
check. The report lists the paused types and counts their due tasks apart.

Its cost stays flat however many tasks the table holds and however many types are paused
(db/queue_figures.py): counts stop past 1,000 and large totals are the statistics'
estimates; ``not_exact`` in the JSON names every figure that is not exact.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ..config import FINISHED_STATUSES
from ..db import store
from ..db.migrate import newer_schema
from ..db.queue_figures import AT_LEAST, HEALTH_COUNT_CAP, TypeFigures
from ..errors import one_line
from .service import PeriodicService


# queue_health's figures -> where as_json() puts them.
# The per-type figures cost about three times the rest of a check on a million PENDING tasks
# (measured: 5.5 ms a check without them, about 20 with them). Where they cost more than
# BY_TYPE_CHEAP they are taken again only after BY_TYPE_EVERY: gauges scraped every 15-30 s
# and alerts held for minutes need them no fresher; a small queue's are fresh every check.
BY_TYPE_CHEAP = 0.005
BY_TYPE_EVERY = 30.0

QUEUE_FIGURES = {"old_pending": "checks.pending_age.old_pending",
                 "paused_due": "checks.pending_age.paused_due",
                 "foreign_due": "checks.pending_age.other_types_due",
                 "expired_leases": "checks.expired_leases.expired",
                 "stuck_leases": "checks.expired_leases.unreaped"}


@dataclass(frozen=True)
class ChildrenStatus:
    live: int
    expected: int
    fused_pools: tuple[str, ...] = ()


@dataclass
class HealthReport:
    database_ok: bool
    database_error: str | None = None
    old_pending: int = 0
    expired_leases: int = 0
    stuck_leases: int = 0
    oldest_pending_age: float = 0.0
    # Due tasks of paused types, left out of old_pending and oldest_pending_age.
    paused_due: int = 0
    # Due tasks of types this daemon does not run, likewise left out.
    foreign_due: int = 0
    paused_types: tuple[str, ...] = ()
    # Global concurrency limits: task type -> (max_running, running under a live lease).
    limits: dict[str, tuple[int, int]] = field(default_factory=dict)
    tasks_by_status: dict[str, int] = field(default_factory=dict)
    # PENDING, RUNNING and the oldest due age of each type the daemon's configs name, and of
    # the others summed (queue_figures.OTHER_TYPES): the per-type gauges.
    by_type: dict[str, TypeFigures] = field(default_factory=dict)
    # True when the finished statuses' counts are the statistics' estimates (a large table).
    finished_estimated: bool = False
    # The figures of as_json() that are not exact, by their path there: "estimate", or
    # "at_least" for a count that stopped at the cap (store.queue_figures).
    not_exact: dict[str, str] = field(default_factory=dict)
    children: ChildrenStatus = ChildrenStatus(0, 0)
    checked_at: float = field(default_factory=time.monotonic)

    def failing(self) -> dict[str, str]:
        """The failing checks, each with a one-line reason; empty means healthy."""
        failing = {}
        if not self.database_ok:
            failing["database"] = f"cannot reach PostgreSQL: {self.database_error}"
        if self.old_pending:
            old = self._figure("checks.pending_age.old_pending", self.old_pending)
            failing["pending_age"] = f"{old} due tasks waited too long"
        if self.stuck_leases:
            stuck = self._figure("checks.expired_leases.unreaped", self.stuck_leases)
            failing["expired_leases"] = f"{stuck} expired leases not reaped"
        if self.children.live < self.children.expected:
            failing["children"] = f"{self.children.live} of {self.children.expected} workers live"
        if self.children.fused_pools:
            failing["pools"] = "restarts stopped for a crash loop: " + ", ".join(self.children.fused_pools)
        return failing

    def _figure(self, path: str, value: int) -> str:
        kind = self.not_exact.get(path)
        return f"more than {value - 1}" if kind == AT_LEAST else str(value)

    def as_json(self) -> dict:
        failing = self.failing()
        return {
            "status": "ok" if not failing else "failing",
            "failing": failing,
            "checks": {
                "database": {"ok": self.database_ok, "error": self.database_error},
                "pending_age": {"ok": not self.old_pending, "old_pending": self.old_pending,
                                "oldest_pending_age_seconds": round(self.oldest_pending_age, 3),
                                "paused_due": self.paused_due,
                                "other_types_due": self.foreign_due},
                "expired_leases": {"ok": not self.stuck_leases, "expired": self.expired_leases,
                                   "unreaped": self.stuck_leases},
                "children": {"ok": self.children.live >= self.children.expected
                             and not self.children.fused_pools,
                             "live": self.children.live, "expected": self.children.expected,
                             "fused_pools": list(self.children.fused_pools)},
            },
            "tasks_by_status": self.tasks_by_status,
            "paused_task_types": list(self.paused_types),
            "limits": {task_type: {"max_running": max_running, "running": running}
                       for task_type, (max_running, running) in self.limits.items()},
            "finished_counts_estimated": self.finished_estimated,
            "not_exact": dict(self.not_exact),
            "age_seconds": round(time.monotonic() - self.checked_at, 3),
        }


class HealthChecker(PeriodicService):
    name_prefix = "health"

    def __init__(self, dsn: str, *, interval: float, max_pending_age: float, lease_grace: float,
                 children: Callable[[], ChildrenStatus], task_types=None,
                 known_types=frozenset(),
                 connect_timeout: float = 5.0,
                 pooled: bool = False,
                 on_newer_schema: Callable[[str], None] = lambda reason: None):
        super().__init__(dsn, interval, connect_timeout=connect_timeout, pooled=pooled)
        self.on_newer_schema = on_newer_schema
        self.max_pending_age = max_pending_age
        self.lease_grace = lease_grace
        self.children = children
        # The types this daemon runs (None: every type): another daemon's due tasks are not
        # this one's backlog. Replaced whole on a reload.
        self.task_types = task_types
        # The types the daemon's configs name (pools, handlers, limits, schedules): each gets
        # its own per-type figures, every other type shares one. Replaced whole on a reload.
        self.known_types = frozenset(known_types)
        self._lock = threading.Lock()
        self._latest = HealthReport(database_ok=False, database_error="not checked yet")
        self._by_type: tuple[float, frozenset, dict] | None = None  # next due, types, figures

    def latest(self) -> HealthReport:
        with self._lock:
            report = self._latest
        # Children come and go between database checks; their count is always current.
        report = HealthReport(**{**report.__dict__, "children": self.children()})
        return report

    def run_once(self) -> HealthReport:
        conn = self.connection()
        # A newer pgtaskd migrated the database under us (a rolling upgrade): checked here,
        # every interval, because claiming on may skip a rule the new schema adds.
        newer = newer_schema(conn)
        if newer:
            self.on_newer_schema(newer)
        queue = store.queue_health(conn, max_pending_age=self.max_pending_age,
                                   lease_grace=self.lease_grace, cap=HEALTH_COUNT_CAP,
                                   task_types=self.task_types)
        live = store.live_counts(conn, cap=HEALTH_COUNT_CAP)
        by_type = self._figures_by_type(conn, live)
        limits = {row["task_type"]: (row["max_running"], row["running"])
                  for row in store.list_limits(conn)}
        not_exact = {f"tasks_by_status.{status}": kind for status, kind in live.not_exact.items()}
        not_exact.update({QUEUE_FIGURES[figure]: kind for figure, kind
                          in queue["not_exact"].items() if figure in QUEUE_FIGURES})
        report = HealthReport(
            database_ok=True, old_pending=queue["old_pending"],
            expired_leases=queue["expired_leases"], stuck_leases=queue["stuck_leases"],
            oldest_pending_age=queue["oldest_pending_age"] or 0.0, tasks_by_status=live.counts,
            paused_due=queue["paused_due"], foreign_due=queue["foreign_due"],
            paused_types=tuple(queue["paused_types"]),
            finished_estimated=any(s in live.not_exact for s in FINISHED_STATUSES),
            not_exact=not_exact, limits=limits, by_type=by_type, children=self.children(),
        )
        with self._lock:
            self._latest = report
        return report

    def _figures_by_type(self, conn, live) -> dict:
        known, started = self.known_types, time.monotonic()
        if self._by_type is None or self._by_type[1] != known or started >= self._by_type[0]:
            figures = store.queue_by_type(conn, known, cap=HEALTH_COUNT_CAP, live=live)
            took = time.monotonic() - started
            self._by_type = (started + (BY_TYPE_EVERY if took > BY_TYPE_CHEAP else 0.0),
                             known, figures)
        return self._by_type[2]

    def on_failure(self, exc: BaseException) -> None:
        with self._lock:
            previous = self._latest
            self._latest = HealthReport(
                database_ok=False, database_error=one_line(exc),
                tasks_by_status=previous.tasks_by_status, paused_types=previous.paused_types,
                by_type=previous.by_type,
                not_exact={path: kind for path, kind in previous.not_exact.items()
                           if path.startswith("tasks_by_status.")},
                limits=previous.limits,
                children=self.children())
