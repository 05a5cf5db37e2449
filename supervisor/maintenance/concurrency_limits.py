"""Writing the config's global concurrency limits (``limits:``) to the database.

The limits live in the database, not in any daemon's memory: every claim reads them, so they
hold for daemons on other hosts whatever their config says. A daemon writes its config's
limits before its first child starts (``write_limits`` from the start-up, on the supervisor's
thread, as migrations are) and again after each reload (``LimitWriter``, a service thread:
the main loop never waits on the database).

Several configs may set one type. Each daemon's setting is its own claim (a row per type and
daemon, the daemon being its host and config file), and the limit in force is the smallest
claim: a limit protects something outside (a card processor's rate, a licence count), and the
config that asks for the least is the one that knows of the tightest bound. A daemon that
drops its line (a reload, or a start without it) drops only its own claim; the limit follows
the claims that remain and goes when the last does. ``pgtaskd limit TYPE N`` sets the limit
over the claims until a daemon next writes one for that type; ``pgtaskd limit TYPE off``
removes it and every claim (daemons whose config still sets it claim it again at their next
start or change of limits). Each change of the limit in force is logged (``limit_changed``,
with the previous value).
"""

from __future__ import annotations

import threading
from typing import Mapping

import psycopg

from ..db import store
from ..logs import emit
from .service import PeriodicService

# After a failed write (the database is down), the next try comes this soon.
RETRY_WAIT = 1.0
# With nothing to write the thread only waits for a reload's wake().
IDLE_WAIT = 3600.0


def write_limits(conn: psycopg.Connection, limits: Mapping[str, int], *, daemon: str,
                 drop: frozenset[str] = frozenset(), starting: bool = False) -> None:
    """Claim each limit of ``limits`` and withdraw this daemon's claims on the types of
    ``drop`` not in it (at a start, on every type it claimed before and no longer sets), then
    put in force what the claims say, in one transaction and in type order, so that daemons
    writing at once never deadlock."""
    with conn.transaction():
        if starting:
            drop = drop | frozenset(store.claimed_limit_types(conn, daemon))
        for task_type in sorted(set(limits) | drop):
            claims = store.claim_limit(conn, task_type, daemon, limits.get(task_type))
            _enforce(conn, task_type, claims)


def _enforce(conn: psycopg.Connection, task_type: str, claims: dict) -> None:
    if claims["max_running"] is not None:
        row = store.set_task_type_limit(conn, task_type, claims["max_running"],
                                        updated_by=f"pgtaskd {claims['daemon']}",
                                        from_claims=True)
        if row["changed"]:
            emit("limit_changed", task_type=task_type, max_running=row["max_running"],
                 previous=row["previous"], claimed_by=claims["daemon"])
    elif claims["from_claims"]:  # the last claim went; an operator's own limit stays
        row = store.remove_task_type_limit(conn, task_type, with_claims=False)
        if row is not None:
            emit("limit_removed", task_type=task_type, max_running=row["max_running"])


class LimitWriter(PeriodicService):
    name_prefix = "limits"

    def __init__(self, dsn: str, *, limits: Mapping[str, int], daemon: str,
                 connect_timeout: float = 5.0, pooled: bool = False):
        super().__init__(dsn, IDLE_WAIT, connect_timeout=connect_timeout, pooled=pooled)
        self.daemon = daemon
        self._lock = threading.Lock()
        # What the database has from us (the start-up wrote it), and what it should have.
        self._written: dict[str, int] = dict(limits)
        self._wanted: dict[str, int] = dict(limits)
        self._wait = IDLE_WAIT

    def apply(self, limits: Mapping[str, int]) -> None:
        """A reload's limits: written at once, on this thread."""
        with self._lock:
            self._wanted = dict(limits)
        self.wake()

    def next_wait(self) -> float:
        return self._wait

    def on_failure(self, exc: BaseException) -> None:
        self._wait = RETRY_WAIT

    def run_once(self) -> None:
        with self._lock:
            wanted, written = self._wanted, self._written
        if wanted == written:
            self._wait = IDLE_WAIT
            self._close()  # no connection held for a write that may never come
            return
        write_limits(self.connection(), wanted, drop=frozenset(written), daemon=self.daemon)
        emit("limits_applied", limits=wanted)
        with self._lock:
            self._written = wanted
        self._wait = 0.0 if self._wanted != wanted else IDLE_WAIT
