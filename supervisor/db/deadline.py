"""A read deadline for blocking database calls: past it, the connection is cut.

Neither libpq nor psycopg's blocking API has a read timeout. TCP keepalives and
``tcp_user_timeout`` catch a dead path, but not a peer that keeps acknowledging and never
answers (a hung proxy, a frozen load balancer): a statement sent there waits forever, and
with it a worker's final write or the supervisor's lease renewals.

``within(conn, seconds)`` registers the call with one watchdog thread per process. If the
block is still running at its deadline, the watchdog shuts the connection's socket down: the
waiting call fails at once with an OperationalError, the connection is broken (a pool throws
it away), and the caller's ordinary retry path takes over. Deadlines are seconds long, so the
watchdog looks every CHECK_EVERY rather than at each deadline: a registration costs a dict
insertion under a lock and never wakes the thread, which matters when a worker makes
thousands of calls a second.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from typing import Iterator

import psycopg

CHECK_EVERY = 0.25


class _Watch:
    __slots__ = ("deadline", "fd", "cut")

    def __init__(self, deadline: float, fd: int):
        self.deadline = deadline
        self.fd = fd
        self.cut = False


class _Watchdog:
    def __init__(self):
        self._lock = threading.Lock()
        self._watches: dict[int, _Watch] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float, fd: int) -> tuple[int, _Watch]:
        watch = _Watch(deadline, fd)
        key = next(self._keys)
        with self._lock:
            self._watches[key] = watch
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="db-deadline",
                                                daemon=True)
                self._thread.start()
        return key, watch

    def unwatch(self, key: int) -> None:
        # Under the lock, so the watchdog never cuts a socket whose call already ended and
        # whose connection may be serving someone else by now.
        with self._lock:
            self._watches.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(CHECK_EVERY)
            now = time.monotonic()
            with self._lock:
                for key, watch in list(self._watches.items()):
                    if watch.deadline <= now:
                        del self._watches[key]
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
    """Run the block's database calls on ``conn`` with a deadline of ``seconds`` (give or
    take CHECK_EVERY)."""
    if seconds is None or conn.closed:
        yield
        return
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        yield
        return
    key, watch = _WATCHDOG.watch(time.monotonic() + seconds, fd)
    try:
        yield
    except psycopg.OperationalError as exc:
        if watch.cut:
            raise DeadlineExceeded(f"no answer from PostgreSQL within {seconds:g} s; "
                                   "the connection was closed") from exc
        raise
    finally:
        _WATCHDOG.unwatch(key)
