"""Retention: deletes finished tasks once they are older than their status's retention.

Each pass visits COMPLETED, FAILED and CANCELLED in turn (a status kept forever is skipped)
and deletes its old tasks in batches of ``batch_size``, one statement and one short
transaction per batch, so that no pass holds many locks or a long transaction, until a batch
comes back short. Age is the database's now() against finished_at, so hosts with skewed
clocks agree. Every daemon on the database runs it: batches are taken with SKIP LOCKED, so
concurrent passes split the work and never wait on each other (see delete_finished_tasks in
queries.sql). PENDING and RUNNING tasks are never candidates.
"""

from __future__ import annotations

from ..config import RetentionConfig
from ..db import store
from ..logs import emit
from .service import PeriodicService


class RetentionService(PeriodicService):
    name_prefix = "retention"

    def __init__(self, dsn: str, *, policy: RetentionConfig, connect_timeout: float = 5.0,
                 on_deleted=None, pooled: bool = False):
        super().__init__(dsn, policy.interval, connect_timeout=connect_timeout, pooled=pooled)
        self.policy = policy
        self.on_deleted = on_deleted or (lambda status, count: None)

    def run_once(self) -> dict[str, int]:
        """Delete every task past its retention, batch by batch; how many, per status (a
        status with nothing to delete is left out)."""
        policy = self.policy  # a reload replaces it whole; a pass keeps the one it began with
        deleted: dict[str, int] = {}
        for status, seconds in policy.periods().items():
            while not self._stop_event.is_set():
                count = store.delete_finished_tasks(self.connection(), status=status,
                                                    older_than_seconds=seconds,
                                                    batch_size=policy.batch_size)
                if count:
                    deleted[status] = deleted.get(status, 0) + count
                    self.on_deleted(status, count)
                    emit("retention_deleted", status=status, deleted=count,
                         older_than_seconds=seconds)
                if count < policy.batch_size:
                    break
        return deleted
