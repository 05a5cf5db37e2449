"""What a handler receives: the task's fields and the means to notice it was cancelled."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Callable, ContextManager

from ..errors import TaskCancelled
from ..logs import emit


@dataclass
class Task:
    id: str
    name: str
    task_type: str
    payload: dict[str, Any]
    priority: int
    retry_count: int
    max_retries: int
    worker_id: str
    attempts: int = 1
    scheduled_time: datetime | None = None
    created_at: datetime | None = None
    # The first reason the task stopped being ours, once it did (set by the lease holder's
    # thread, read by the handler's: one reference assignment, atomic).
    _lost_reason: str | None = field(default=None, repr=False)
    _connection: Callable[[], ContextManager] | None = field(default=None, repr=False)
    # When the lease runs out by this worker's monotonic clock unless a renewal lands first.
    # Checked by is_cancelled() itself, so renewals that stopped getting through (a stalled
    # connection, a supervisor that cannot reach the database) cannot keep the handler
    # believing it still owns the task.
    lease_expires_at: float = field(default=float("inf"), repr=False)
    # How long before that the task already counts as lost (stop_margin): a handler checks
    # at safe points, and must be past its last one before another worker may claim.
    lease_margin: float = field(default=0.0, repr=False)
    # Reads renewals that arrived but were not handled yet (a handler that held the GIL kept
    # the reader thread from running), before the clock is allowed to call the lease lost.
    _refresh: Callable[[], None] | None = field(default=None, repr=False)
    # Set (to the reason) when the supervisor stopped the run past its type's timeout.
    timed_out: str | None = field(default=None, repr=False)
    # Set when the stored payload could not be decoded: the task fails without running.
    undecodable: BaseException | None = field(default=None, repr=False)

    @property
    def idempotency_key(self) -> str:
        """Stable across every run of this task: key external effects with it."""
        return self.id

    def is_cancelled(self) -> bool:
        """True once the task is no longer ours to finish: cancelled, or its lease was lost.

        The lease renewal finds this out, so it turns true within one renew interval; and if
        no renewal got through before the lease ran out by the worker's own clock, it is true
        too, since another worker may own the task by then. A handler doing long work should
        check it at safe points and stop.
        """
        if self._lost_reason is None and time.monotonic() >= self.lease_ends_at:
            if self._refresh is not None:
                self._refresh()
            if self._lost_reason is None and time.monotonic() >= self.lease_ends_at:
                self.mark_lost("lease expired before a renewal got through")
                emit("lease_lost", logging.WARNING, reason=self.cancel_reason, task_id=self.id,
                     worker_id=self.worker_id, task_type=self.task_type,
                     retry_count=self.retry_count)
        return self._lost_reason is not None

    @property
    def lease_ends_at(self) -> float:
        return self.lease_expires_at - self.lease_margin

    def renewed(self, expires_at: float) -> None:
        """A renewal landed: the lease is ours until ``expires_at`` (monotonic), the end the
        renewal wrote, which is earlier than the one before when a reload shortened it."""
        self.lease_expires_at = expires_at

    @property
    def cancel_reason(self) -> str | None:
        return self._lost_reason

    def raise_if_cancelled(self) -> None:
        if self.is_cancelled():
            raise TaskCancelled(self.cancel_reason or "cancelled")

    def connection(self) -> ContextManager:
        """A database connection (autocommit) borrowed from the worker, for idempotent writes
        such as recording an operation id under a unique constraint."""
        if self._connection is None:
            raise RuntimeError("this task has no database connection attached")
        return self._connection()

    def mark_lost(self, reason: str) -> None:
        if self._lost_reason is None:
            self._lost_reason = reason

    @classmethod
    def from_row(cls, row: dict, *, worker_id: str,
                 connection: Callable[[], ContextManager] | None = None,
                 refresh: Callable[[], None] | None = None) -> "Task":
        """A task from a claimed row; its payload is decoded by the worker (decode_payload)."""
        payload = row["payload"]
        return cls(
            id=row["id"], name=row["name"], task_type=row["task_type"],
            payload=payload if isinstance(payload, dict) else {"value": payload},
            priority=row["priority"], retry_count=row["retry_count"],
            max_retries=row["max_retries"], worker_id=worker_id,
            attempts=row.get("attempts", 1), scheduled_time=row.get("scheduled_time"),
            created_at=row.get("created_at"), _connection=connection, _refresh=refresh,
        )


def _big_int(text: str) -> int | Decimal:
    # Python refuses to convert integers of more than 4300 digits (a denial-of-service
    # guard); valid JSON from another language may hold one. Keep it exact as a Decimal.
    try:
        return int(text)
    except ValueError:
        return Decimal(text)


_DECODER = json.JSONDecoder(parse_int=_big_int)


def decode_payload(text: str) -> Any:
    """The payload's JSON text as Python values; ValueError if it cannot be read."""
    return _DECODER.decode(text)
