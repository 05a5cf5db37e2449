"""A read deadline for blocking database calls: past it, the connection is cut.

Neither libpq nor psycopg's blocking API has a read timeout. TCP keepalives and
``tcp_user_timeout`` catch a dead path, but not a peer that keeps acknowledging and never
answers (a hung proxy, a frozen load balancer): a statement sent there waits forever, and
with it a worker's final write or the supervisor's lease renewals.

``within(conn, seconds)`` registers the call with one watchdog thread per process. If the
block is still running at its deadline, the watchdog shuts the connection's socket down: the
waiting call fails at once with an OperationalError, the connection is broken (a pool throws
it away), and the caller's ordinary retry path takes over. A registration costs a lock and a
heap push; no thread is started per call.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from typing import Iterator

import psycopg


class _Watch:
    __slots__ = ("deadline", "fd", "active", "cut")

    def __init__(self, deadline: float, fd: int):
        self.deadline = deadline
        self.fd = fd
        self.active = True
        self.cut = False


class _Watchdog:
    def __init__(self):
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float, fd: int) -> _Watch:
        watch = _Watch(deadline, fd)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="db-deadline",
                                                daemon=True)
                self._thread.start()
            earliest = self._heap[0][0] if self._heap else None
            heapq.heappush(self._heap, (deadline, next(self._order), watch))
            if earliest is None or deadline < earliest:
                self._lock.notify()
        return watch

    def unwatch(self, watch: _Watch) -> None:
        # Under the lock, so the watchdog never cuts a socket whose call already ended and
        # whose connection may be serving someone else by now.
        with self._lock:
            watch.active = False

    def _run(self) -> None:
        with self._lock:
            while True:
                while self._heap and not self._heap[0][2].active:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._lock.wait()
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._lock.wait(left)
                    continue
                _, _, watch = heapq.heappop(self._heap)
                watch.cut = True
                _shutdown(watch.fd)


def _shutdown(fd: int) -> None:
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()  # the fd stays libpq's; only the connection on it is ended


_WATCHDOG = _Watchdog()


class DeadlineExceeded(psycopg.OperationalError):
    """The database did not answer within the call's deadline; the connection was cut."""


@contextlib.contextmanager
def within(conn: psycopg.Connection, seconds: float | None) -> Iterator[None]:
    """Run the block's database calls on ``conn`` with a deadline of ``seconds``."""
    if seconds is None or conn.closed:
        yield
        return
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        yield
        return
    watch = _WATCHDOG.watch(time.monotonic() + seconds, fd)
    try:
        yield
    except psycopg.OperationalError as exc:
        if watch.cut:
            raise DeadlineExceeded(f"no answer from PostgreSQL within {seconds:g} s; "
                                   "the connection was closed") from exc
        raise
    finally:
        _WATCHDOG.unwatch(watch)
