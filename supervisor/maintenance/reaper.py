"""The lease reaper: returns RUNNING tasks whose lease expired to PENDING (or FAILED).

Their owners were workers of any daemon, on any host, that died or were cut off. The claim
would also take such a task over, but only for a worker of the right type that happens to
poll; the reaper makes recovery (and the retry accounting) independent of that. Many daemons
may run it on one database at once: each batch is taken with SKIP LOCKED and every update
re-checks that the lease is still expired. Each pass also repairs the global limits' slot
rows (a slot never outlives its claim's lease).
"""

from __future__ import annotations

import logging

from ..config import RetryConfig
from ..db import store
from ..logs import emit
from .service import PeriodicService


class LeaseReaper(PeriodicService):
    name_prefix = "reaper"

    def __init__(self, dsn: str, *, interval: float, batch_size: int, retry: RetryConfig,
                 connect_timeout: float = 5.0, on_reaped=None, pooled: bool = False):
        super().__init__(dsn, interval, connect_timeout=connect_timeout, pooled=pooled)
        self.batch_size = batch_size
        self.retry = retry
        self.on_reaped = on_reaped or (lambda row: None)

    def run_once(self) -> list[dict]:
        """Reap every expired lease, batch by batch; return the rows changed."""
        reaped: list[dict] = []
        while not self._stop_event.is_set():
            rows = store.reap_expired_leases(self.connection(), batch_size=self.batch_size,
                                             retry=self.retry)
            for row in rows:
                self.on_reaped(row)
                level = logging.ERROR if row["status"] == "FAILED" else logging.WARNING
                emit("lease_expired_task_failed" if row["status"] == "FAILED"
                     else "lease_expired_task_requeued", level,
                     task_id=row["id"], task_type=row["task_type"],
                     retry_count=row["retry_count"],
                     retry_delay=round(row["retry_delay"], 3) if row["status"] == "PENDING" else None,
                     error=row["error_message"])
            reaped.extend(rows)
            if len(rows) < self.batch_size:
                break
        self.repair_slots()
        return reaped

    def repair_slots(self) -> None:
        """Slot rows that plain SQL deleted or wrote (held 'infinity', by a claim that ended)
        stall a limited type for good, since no claim takes them and no end frees them: each
        pass makes them agree with the tasks again (store.repair_limit_slots)."""
        repaired = store.repair_limit_slots(self.connection())
        if any(repaired.values()):
            emit("limit_slots_repaired", logging.WARNING, **repaired)
