"""Wake-ups: one LISTEN connection per daemon, relayed to idle children over their links.

Triggers on the tasks table (migration 0002) notify the channel ``pgtaskd_tasks`` whenever
tasks become due or are scheduled: an INSERT by any client in any language, a retry, a
release, an operator's reschedule. The relay wakes as many idle children of the pools that
run those types as there are due tasks, and sets a timer for the earliest task that is due
later. Notifications are hints: children still poll every ``poll_interval``, which covers a
missed notification, a listening connection that is down, and tasks due later than the
earliest one a notification named.

A child reports "idle" with the time its empty claim started. A notification that arrived
after that time may be for a task the claim could not see yet, so such a child is woken at
once (``wake_if_missed``): no wake-up is lost between a claim and the wait that follows it.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from typing import Callable, Sequence

import psycopg

from .children import Child
from ..db import store
from ..db.connect import connect
from ..db.deadline import within
from ..errors import OperationalError, one_line
from ..logs import emit

CHANNEL = "pgtaskd_tasks"
# How long one wait for notifications lasts before the thread checks its timers and whether
# it should stop.
LISTEN_SLICE = 1.0
# A quiet listening connection is checked this often: a peer that stopped answering would
# otherwise leave the daemon on polling without anyone knowing.
PING_AFTER = 30.0
MAX_TIMERS = 10_000
# Reconnecting is what ends the workers' backoff after an outage (it wakes them all): a
# try every few seconds costs the server nothing, and the queue is served again soon after.
MAX_RECONNECT_DELAY = 5.0


class WakeRelay(threading.Thread):
    def __init__(self, dsn: str, *, children: Callable[[], Sequence[Child]],
                 connect_timeout: float = 5.0,
                 on_cancelled: Callable[[str], None] = lambda task_id: None):
        super().__init__(name="wakeups", daemon=True)
        self.dsn = dsn
        self.children = children
        self.connect_timeout = connect_timeout
        self.on_cancelled = on_cancelled
        self.last_notice = 0.0  # monotonic time of the latest notification received
        self.listening = False
        self.schema: str | None = None
        self._timers: list[tuple[float, tuple[str, ...] | None]] = []
        self._stopping = threading.Event()
        self._conn: psycopg.Connection | None = None

    def stop(self, timeout: float = 3.0) -> None:
        self._stopping.set()
        self.join(timeout)

    # -- called from the main loop ---------------------------------------------------------

    def wake_if_missed(self, child: Child) -> None:
        """The child just said it found nothing at ``child.idle_since``: wake it again if a
        notification came in since then."""
        since = child.idle_since
        if since is not None and self.last_notice >= since:
            child.wake()

    # -- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        delay = 0.5
        failing = False
        while not self._stopping.is_set():
            try:
                self._listen()
            except (psycopg.Error, OperationalError) as exc:
                self.listening = False
                self._close()
                if not failing:
                    failing = True
                    emit("wakeups_unavailable", logging.WARNING,
                         error=one_line(exc), fallback="polling")
                self._stopping.wait(delay)
                delay = min(delay * 2, MAX_RECONNECT_DELAY)
                continue
            failing = False
        self._close()

    def _listen(self) -> None:
        conn = connect(self.dsn, connect_timeout=self.connect_timeout,
                       application_name="pgtaskd wakeups")
        self._conn = conn
        conn.execute(f"LISTEN {CHANNEL}")
        # The schema of the tasks table this daemon uses (its search_path decides).
        self.schema = store.tasks_schema(conn)
        self.listening = True
        emit("wakeups_listening", channel=CHANNEL)
        # Whatever became due while nobody listened.
        self._wake(None, count=None)
        quiet_since = time.monotonic()
        while not self._stopping.is_set():
            for notice in conn.notifies(timeout=self._slice()):
                self.last_notice = time.monotonic()
                quiet_since = self.last_notice
                self._on_notice(notice.payload)
            self._fire_timers()
            if time.monotonic() - quiet_since > PING_AFTER:
                with within(conn, self.connect_timeout):
                    conn.execute("SELECT 1")
                quiet_since = time.monotonic()

    def _slice(self) -> float:
        if not self._timers:
            return LISTEN_SLICE
        return max(0.0, min(LISTEN_SLICE, self._timers[0][0] - time.monotonic()))

    def _on_notice(self, payload: str) -> None:
        try:
            notice = json.loads(payload)
            if notice.get("schema", self.schema) != self.schema:
                return  # another pgtaskd's table in this database
            if "cancelled" in notice:
                self.on_cancelled(str(notice["cancelled"]))
                return
            types = notice.get("types")
            types = tuple(str(t) for t in types) if isinstance(types, list) else None
            due = int(notice.get("due") or 0)
            delay = notice.get("delay")
            delay = float(delay) if delay is not None else None
        except (ValueError, TypeError, AttributeError):
            # Not ours, or mangled: treat it as "something changed".
            types, due, delay = None, 1, None
        if due > 0:
            self._wake(types, count=due)
        if delay is not None and delay >= 0 and len(self._timers) < MAX_TIMERS:
            # A millisecond late rather than early: woken early, a child finds nothing and
            # would wait for its next poll.
            heapq.heappush(self._timers, (time.monotonic() + delay + 0.001, types))

    def _fire_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, types = heapq.heappop(self._timers)
            self._wake(types, count=1)

    def _wake(self, types: tuple[str, ...] | None, *, count: int | None) -> None:
        """Wake up to ``count`` idle children that run any of ``types`` (all: None)."""
        idle = [c for c in self.children()
                if c.booted and not c.stopping and c.idle_since is not None and c.handles(types)]
        # The longest idle first: its poll is furthest away.
        idle.sort(key=lambda c: c.idle_since or 0.0)
        for child in idle[:count]:
            child.wake()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass

