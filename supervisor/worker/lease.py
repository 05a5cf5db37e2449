"""Lease renewal: a thread that extends the claim while the handler runs.

It is also how a running handler learns that its task was cancelled or taken over: the
conditioned renewal changes no row, and the thread marks the task lost.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
from psycopg_pool import PoolTimeout

from .. import metrics
from ..db import store
from ..logs import emit
from .task import Task


class LeaseRenewer(threading.Thread):
    def __init__(self, *, pool, claim: store.Claim, task: Task, lease_seconds: float,
                 renew_interval: float, pool_name: str):
        super().__init__(name=f"lease-{claim.task_id}", daemon=True)
        self.pool = pool
        self.claim = claim
        self.task = task
        self.lease_seconds = lease_seconds
        self.renew_interval = renew_interval
        self.pool_name = pool_name
        self._stop_event = threading.Event()
        # When our lease runs out by our own clock if no renewal gets through.
        self._expires_at = time.monotonic() + lease_seconds

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def run(self) -> None:
        while not self._stop_event.wait(self._next_wait()):
            if not self._renew_once():
                return

    def _next_wait(self) -> float:
        # After a failed renewal, try again sooner than a full interval, but before the lease
        # would lapse by our own clock.
        left = self._expires_at - time.monotonic()
        return max(0.05, min(self.renew_interval, left / 2)) if left < self.renew_interval else \
            self.renew_interval

    def _renew_once(self) -> bool:
        """One renewal; False once the claim is lost and renewing should end."""
        fields = dict(task_id=self.claim.task_id, worker_id=self.claim.worker_id,
                      task_type=self.task.task_type, retry_count=self.task.retry_count)
        try:
            with self.pool.connection() as conn:
                renewed = store.renew_lease(conn, self.claim, lease_seconds=self.lease_seconds)
                if not renewed:
                    row = store.task_status(conn, self.claim.task_id)
        except (psycopg.Error, PoolTimeout) as exc:
            emit("lease_renew_failed", logging.WARNING, error=_one_line(exc), **fields)
            if time.monotonic() >= self._expires_at:
                # Another worker may own the task by now: ask the handler to stop.
                self.task.mark_lost("lease expired while the database was unreachable")
                emit("lease_lost", logging.WARNING, reason="lease expired unrenewed", **fields)
            return True
        if renewed:
            self._expires_at = time.monotonic() + self.lease_seconds
            metrics.LEASE_RENEWALS.labels(self.pool_name, self.task.task_type).inc()
            emit("lease_renewed", **fields)
            return True
        status = row["status"] if row else "DELETED"
        if status == "CANCELLED":
            self.task.mark_lost("cancelled")
            emit("task_cancelled", while_running=True, **fields)
        else:
            self.task.mark_lost(f"lease lost (task is now {status})")
            emit("lease_lost", logging.WARNING, status=status, **fields)
        return False


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__
