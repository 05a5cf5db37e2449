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
        self._told_lost = False

    @property
    def _expires_at(self) -> float:
        return self.task.lease_expires_at

    def stop(self) -> None:
        """Stop renewing. A renewal stuck on a stalled connection is not waited for: the
        TCP timeouts end it, and the final write goes through another connection."""
        self._stop_event.set()
        self.join(timeout=1.0)

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
        # The database extends the lease from its now(), which is no earlier than this.
        sent_at = time.monotonic()
        try:
            with self.pool.connection() as conn:
                renewed = store.renew_lease(conn, self.claim, lease_seconds=self.lease_seconds)
                if not renewed:
                    row = store.task_status(conn, self.claim.task_id)
        except (psycopg.Error, PoolTimeout) as exc:
            emit("lease_renew_failed", logging.WARNING, error=_one_line(exc), **fields)
            if self.task.is_cancelled() and not self._told_lost:
                # Another worker may own the task by now: the handler is told to stop. Keep
                # renewing all the same: if nobody took the task, a renewal that lands keeps
                # a handler that does not check from being run twice at once.
                self._told_lost = True
                emit("lease_lost", logging.WARNING, reason="lease expired unrenewed", **fields)
            return True
        if renewed:
            self.task.lease_expires_at = sent_at + self.lease_seconds
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
