"""A periodic background service: ``run_once()`` every ``interval`` seconds in its own thread,
with its own database connection, reopened after any failure. A service whose next pass is
due sooner (the scheduler, at its next instant) says so in ``next_wait()``; ``wake()`` runs a
pass at once (after a reload changed what the service does)."""

from __future__ import annotations

import logging
import threading

import psycopg

from ..db.connect import LazyConnection
from ..db.deadline import within
from ..errors import OperationalError, one_line
from ..logs import emit


# A pass may take longer than its interval (a reaper catching up); it may not take forever.
MIN_DEADLINE = 30.0


class PeriodicService(threading.Thread):
    name_prefix = "service"

    def __init__(self, dsn: str, interval: float, *, connect_timeout: float = 5.0,
                 pooled: bool = False):
        super().__init__(name=self.name_prefix, daemon=True)
        self.dsn = dsn
        self.interval = interval
        self.connect_timeout = connect_timeout
        self._stop_event = threading.Event()
        # Set by stop() and wake(): the wait between passes ends early for either.
        self._wake_event = threading.Event()
        self._conn = LazyConnection(dsn, connect_timeout=connect_timeout,
                                    application_name=f"pgtaskd {self.name_prefix}", pooled=pooled)
        self._failing = False

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self._wake_event.set()
        self.join(timeout)

    def wake(self) -> None:
        """Run the next pass now rather than at the end of the wait."""
        self._wake_event.set()

    def next_wait(self) -> float:
        """Seconds from the end of one pass to the start of the next."""
        return self.interval

    def connection(self) -> psycopg.Connection:
        return self._conn.get()

    def _close(self) -> None:
        self._conn.close()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.tick()
            self._wake_event.wait(self.next_wait())
            self._wake_event.clear()
        self.on_stop()
        self._close()

    def tick(self) -> None:
        """One run_once() that never raises: a failure is logged when it starts and ends.

        Its statements share a read deadline: a connection whose peer stopped answering is
        cut rather than left to hold this service's thread forever."""
        try:
            with within(self.connection(), max(self.interval, MIN_DEADLINE)):
                self.run_once()
        except (psycopg.Error, OperationalError) as exc:
            self._close()
            self.on_failure(exc)
            if not self._failing:
                self._failing = True
                emit(f"{self.name_prefix}_failing", logging.ERROR, error=one_line(exc))
            return
        except Exception as exc:  # a bug here must not kill the thread silently
            self._close()
            self.on_failure(exc)
            emit(f"{self.name_prefix}_error", logging.ERROR, exc_info=True, error=repr(exc)[:300])
            return
        if self._failing:
            self._failing = False
            emit(f"{self.name_prefix}_recovered")

    def run_once(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def on_failure(self, exc: BaseException) -> None:
        """Hook for services that must record a failure (the health check does)."""

    def on_stop(self) -> None:
        """Hook for a last write once stopped, before the connection closes (the registry
        signs off). It must not raise, and must not outlast stop()'s join."""
