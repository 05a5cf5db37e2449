"""Writing the config's global concurrency limits (``limits:``) to the database.

The limits live in the database, not in any daemon's memory: every claim reads them, so they
hold for daemons on other hosts whatever their config says. A daemon writes its config's
limits before its first child starts (``write_limits`` from the start-up, on the supervisor's
thread, as migrations are) and again after each reload (``LimitWriter``, a service thread:
the main loop never waits on the database). A limit a reload removed from the config is
removed from the database only if this daemon had set it: another daemon's, or one set with
``pgtaskd limit``, is not this config's to drop.

Daemons whose configs give one type different limits overwrite each other at each start or
reload; each change is logged (``limit_changed``, with the previous value), so that such a
fight shows in the logs rather than in a limit that seems to change by itself.
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


def write_limits(conn: psycopg.Connection, limits: Mapping[str, int], *,
                 drop: frozenset[str] = frozenset(), set_by: str) -> None:
    """Set each limit and remove those in ``drop`` (not in ``limits``), in one transaction,
    in one order whatever the config's, so that daemons writing at once never deadlock."""
    with conn.transaction():
        for task_type in sorted(limits):
            row = store.set_task_type_limit(conn, task_type, limits[task_type],
                                            updated_by=set_by)
            if row["changed"]:
                emit("limit_changed", task_type=task_type, max_running=row["max_running"],
                     previous=row["previous"])
        for task_type in sorted(drop - set(limits)):
            row = store.remove_task_type_limit(conn, task_type)
            if row is not None:
                emit("limit_removed", task_type=task_type, max_running=row["max_running"])


class LimitWriter(PeriodicService):
    name_prefix = "limits"

    def __init__(self, dsn: str, *, limits: Mapping[str, int], set_by: str,
                 connect_timeout: float = 5.0, pooled: bool = False):
        super().__init__(dsn, IDLE_WAIT, connect_timeout=connect_timeout, pooled=pooled)
        self.set_by = set_by
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
        write_limits(self.connection(), wanted, drop=frozenset(written), set_by=self.set_by)
        emit("limits_applied", limits=wanted)
        with self._lock:
            self._written = wanted
        self._wait = 0.0 if self._wanted != wanted else IDLE_WAIT
