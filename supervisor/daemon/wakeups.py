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
# Bounds on what a notification may ask for: more wake-ups than any daemon has children, a
# timer further away than any poll interval, an id longer than any task's.
MAX_WAKE_COUNT = 10_000
MAX_TIMER_SECONDS = 86_400.0
MAX_TASK_ID = 1_000
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
            # Taken whole before they are handled: the connection is locked while its
            # notifies() generator runs, and checking a cancel needs a query on it.
            notices = list(conn.notifies(timeout=self._slice(), stop_after=1))
            if notices:
                self.last_notice = time.monotonic()
                quiet_since = self.last_notice
                cancelled = [task_id for n in notices
                             if (task_id := self._on_notice(n.payload)) is not None]
                if cancelled:
                    self._confirm_cancels(conn, cancelled)
            self._fire_timers()
            if time.monotonic() - quiet_since > PING_AFTER:
                with within(conn, self.connect_timeout):
                    conn.execute("SELECT 1")
                quiet_since = time.monotonic()

    def _slice(self) -> float:
        if not self._timers:
            return LISTEN_SLICE
        return max(0.0, min(LISTEN_SLICE, self._timers[0][0] - time.monotonic()))

    def _on_notice(self, payload: str) -> str | None:
        """Act on one notification; the task id it says was cancelled, to be checked.

        Any login may NOTIFY this channel with any payload: whatever it holds only ever wakes
        children (which then look for themselves) or names a task to look up, and no value
        may end this thread."""
        try:
            notice = json.loads(payload)
        except (ValueError, RecursionError):
            notice = None
        if not isinstance(notice, dict):
            notice = {"due": 1}  # not ours, or mangled: treat it as "something changed"
        if notice.get("schema", self.schema) != self.schema:
            return None  # another pgtaskd's table in this database
        if "cancelled" in notice:
            task_id = notice["cancelled"]
            return task_id if isinstance(task_id, str) and len(task_id) <= MAX_TASK_ID else None
        types = notice.get("types")
        types = tuple(t for t in types if isinstance(t, str)) if isinstance(types, list) else None
        due = _count(notice.get("due"))
        delay = _seconds(notice.get("delay"))
        if due > 0:
            self._wake(types, count=due)
        if delay is not None and len(self._timers) < MAX_TIMERS:
            # A millisecond late rather than early: woken early, a child finds nothing and
            # would wait for its next poll.
            heapq.heappush(self._timers, (time.monotonic() + delay + 0.001, types))
        return None

    def _confirm_cancels(self, conn, task_ids: list[str]) -> None:
        """A notification is a hint: only a task the database shows CANCELLED is acted on
        (a cancel ends every claim of the task, so any child still holding one is told)."""
        with within(conn, self.connect_timeout):
            states = store.claim_states(conn, task_ids)
        for task_id in dict.fromkeys(task_ids):
            row = states.get(task_id)
            if row is not None and row["status"] == "CANCELLED":
                self.on_cancelled(task_id)

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



def _count(value) -> int:
    """A notification's "due": a whole number of tasks, else 1 (something changed)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 1
    return 0 if value <= 0 else int(min(value, MAX_WAKE_COUNT))


def _seconds(value) -> float | None:
    """A notification's "delay": seconds from now, or None for none or nonsense."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if 0 <= value <= MAX_TIMER_SECONDS else None
