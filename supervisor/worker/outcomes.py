"""How a worker settles each claim once its run is over: the final write, conditioned on the
claim's fencing token, and what the outcome counts and logs.

A run that succeeded waits (as a Done) for its completion to ride on the next claim, or on a
flush; a failure, a cancellation or a stale result is written at once. A final write that
changes no row means the claim was lost: the result is dropped and logged as stale. A claim
lost to a cancel kept its slot (a limited type) while its handler ran; once the run is over,
end_lost_claims gives it back.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from psycopg_pool import ConnectionPool

from .. import metrics
from ..config import Config
from ..db import store
from ..db.deadline import within
from ..errors import TaskCancelled
from ..logs import emit, print_text
from .failures import describe, failure_of, shorten, with_origin
from .final_writes import DB_ERRORS, STATEMENT_DEADLINE, AlreadyWritten, write_final
from .leases import LeaseHolder
from .task import Task

# How long a final write keeps retrying through a database outage before giving up; past it
# the lease has long expired and the task runs again elsewhere (at-least-once).
MIN_FINALIZE_PATIENCE = 60.0
MAX_ERROR_MESSAGE = 4000


@dataclass(frozen=True)
class Outcome:
    """How one run ended, as the metrics name it."""
    name: str  # completed | retried | failed | cancelled | stale | lost
    status: str | None = None
    retry_count: int | None = None
    retry_delay: float | None = None


@dataclass
class Done:
    """A run whose handler succeeded, waiting for its completion to be written."""
    claim: store.Claim
    task: Task
    fields: dict
    duration: float
    usage: tuple[float | None, int | None] = (None, None)  # CPU seconds, peak RSS bytes


class Settling:
    """The Worker's final writes and outcome bookkeeping: a mixin, because every method works
    on the claims the loop holds and on the completions it shares with the batch guard."""

    # Set by Worker.__init__.
    config: Config
    pool: ConnectionPool
    leases: LeaseHolder
    pool_name: str
    keep_outcomes: bool
    print_tracebacks: bool
    outcomes: dict[int, Outcome]
    _held: dict[int, Task]
    _batch: threading.Condition
    _done: list[Done]

    def _record(self, token: int, outcome: Outcome, task: Task, duration: float | None,
                usage: tuple[float | None, int | None] = (None, None)) -> None:
        """A claim is settled: stop its renewal, count it, remember how it ended."""
        self._held.pop(token, None)
        self.leases.drop([token])
        if duration is not None:
            metrics.TASK_DURATION.labels(self.pool_name, task.task_type,
                                         outcome.name).observe(duration)
        # A concurrent child measures a thread's CPU but no run's own peak memory, and an
        # async run's neither (concurrent.py).
        if usage[0] is not None:
            metrics.TASK_CPU.labels(self.pool_name, task.task_type).observe(usage[0])
        if usage[1] is not None:
            metrics.TASK_PEAK_RSS.labels(self.pool_name, task.task_type).observe(usage[1])
        if self.keep_outcomes:
            self.outcomes[token] = outcome

    # -- completions --------------------------------------------------------------------------

    def flush(self) -> None:
        """Write every completion still waiting (the worker stops or runs out of work)."""
        with self._batch:
            done, self._done = self._done, []
        self._write_completions(done)

    def _write_completions(self, done: list[Done]) -> None:
        if not done:
            return
        landed = self._finalize(lambda conn: store.complete_tasks(conn, [d.claim for d in done],
                                                                  [d.usage for d in done]),
                                done[0].claim, {**done[0].fields, "tasks": len(done)})
        if landed is None:
            for item in done:
                self._record(item.claim.token, Outcome("lost"), item.task, item.duration)
            return
        if isinstance(landed, AlreadyWritten):
            landed = landed.tokens
        self._report_completions(done, landed, check_own=True)

    def _report_completions(self, done: list[Done], landed: set[int], *,
                            check_own: bool = False) -> None:
        if not done:
            return
        missing = [d for d in done if d.claim.token not in landed]
        if missing and check_own:
            # A retried write: an earlier try may have landed with its answer lost.
            landed = set(landed) | self._own_writes([d.claim for d in missing])
        lost = [d for d in done if d.claim.token not in landed]
        if lost:
            self._end_lost([d.claim for d in lost], lost[0].fields)
        settled = []
        count_by_type(metrics.TASKS_COMPLETED, self.pool_name,
               (item.task for item in done if item.claim.token in landed))
        for item in done:
            if item.claim.token in landed:
                emit("task_completed", **item.fields)
                outcome = Outcome("completed", "COMPLETED", item.task.retry_count)
            else:
                outcome = self._stale(item.claim, item.task, item.fields, "completed")
            settled.append((item, outcome))
        for item, outcome in settled:
            self._record(item.claim.token, outcome, item.task, item.duration, item.usage)

    def _own_writes(self, claims: list[store.Claim]) -> set[int]:
        try:
            with self.pool.connection() as conn, within(conn, STATEMENT_DEADLINE):
                states = store.claim_states(conn, [c.task_id for c in claims])
        except DB_ERRORS:
            return set()
        return {c.token for c in claims
                if (row := states.get(c.task_id)) and row["lease_token"] == c.token
                and row["status"] == "COMPLETED"}

    # -- failures, cancellations, stale results -----------------------------------------------

    def _fail(self, claim, task, error, permanent, fields, usage=(None, None)) -> Outcome:
        message = describe(error)
        detail = message if permanent else with_origin(error, message)
        failure = failure_of(error, permanent)
        if self.print_tracebacks and failure.traceback:
            print_text(f"task {task.id} (run {task.attempts}) failed:\n{failure.traceback}")
        # fail_attempt answers None when the claim is not ours; "or False" keeps that apart
        # from _finalize's None, which means the write was given up on.
        result = self._finalize(
            lambda conn: store.fail_attempt(conn, claim, error=detail[:MAX_ERROR_MESSAGE],
                                            permanent=permanent, retry=self.config.retry,
                                            cpu_seconds=usage[0], peak_rss_bytes=usage[1],
                                            failure=failure)
            or False,
            claim, fields)
        if result is None:
            return Outcome("lost")
        if not result:
            self._end_lost([claim], fields)
            return self._stale(claim, task, fields, "failed")
        if isinstance(result, AlreadyWritten):
            result = {"status": result.row["status"], "retry_count": result.row["retry_count"],
                      "retry_delay": None}
        fields = {**fields, "retry_count": result["retry_count"]}
        if result["status"] == "FAILED":
            metrics.TASKS_FAILED.labels(self.pool_name, task.task_type).inc()
            emit("task_failed", logging.ERROR, error=shorten(message), permanent=permanent,
                 **fields)
            return Outcome("failed", "FAILED", result["retry_count"])
        delay = None if result["retry_delay"] is None else round(result["retry_delay"], 3)
        metrics.TASKS_RETRIED.labels(self.pool_name, task.task_type).inc()
        emit("task_retry_scheduled", logging.WARNING, error=shorten(message), retry_delay=delay,
             **fields)
        return Outcome("retried", "PENDING", result["retry_count"], delay)

    def _lost_before_start(self, claim, task, fields) -> Outcome:
        """A claim found lost before its handler started. If the database still shows it
        ours (our own clock called its lease lost, or a supervisor that saw this child stopped
        told us, then found it let go and left the claim to us), it goes back without
        spending a retry: it never ran. Otherwise, as a run stopped by its loss."""
        released = self._finalize(
            lambda conn: store.release_tasks(conn, [(claim.task_id, claim.token)]), claim,
            fields)
        if released:
            emit("task_released", reason=task.cancel_reason, never_started=True, **fields)
            return Outcome("released")
        if released is None:
            return Outcome("lost")
        return self._stopped_by_cancel(claim, task, fields)

    def _stopped_by_cancel(self, claim, task, fields) -> Outcome:
        """The handler stopped at a safe point because the task was no longer ours (or never
        started): its run is over, which gives back the slot a cancel left it."""
        row = self._finalize(lambda conn: store.end_lost_claims(
            conn, [(claim.task_id, claim.token)]).get(claim.task_id), claim, fields)
        still_ours = bool(row) and row["status"] == "RUNNING" and row["lease_token"] == claim.token
        if still_ours:
            # Our clock said the lease ran out while the database was away, yet nobody took
            # the task: count the interrupted run as a failed attempt rather than leave it
            # RUNNING until the lease expires.
            return self._fail(claim, task, TaskCancelled(task.cancel_reason or "stopped"),
                              False, fields)
        if row is None or row["status"] != "CANCELLED":
            # Nobody cancelled it: the lease passed to another worker, which runs it now.
            return self._stale(claim, task, fields, "stopped")
        metrics.TASKS_CANCELLED.labels(self.pool_name, task.task_type).inc()
        emit("task_cancelled", reason=task.cancel_reason, stopped_by_handler=True, **fields)
        return Outcome("cancelled", "CANCELLED")

    def _end_lost(self, claims: list[store.Claim], fields: dict) -> None:
        """Runs whose claims were lost are over (their final writes changed nothing): give
        back the slots a cancel left them, now rather than when their leases run out, which
        they do anyway should this write be given up on."""
        if claims:
            pairs = [(c.task_id, c.token) for c in claims]
            self._finalize(lambda conn: store.end_lost_claims(conn, pairs), claims[0], fields)

    def _stale(self, claim, task, fields, result: str) -> Outcome:
        metrics.STALE_RESULTS.labels(self.pool_name, task.task_type).inc()
        emit("stale_result_discarded", logging.WARNING, result=result,
             reason=task.cancel_reason or "claim lost before the final write", token=claim.token,
             **fields)
        return Outcome("stale")

    def _finalize(self, write: Callable, claim: store.Claim, fields: dict):
        patience = max(MIN_FINALIZE_PATIENCE, 2 * self.config.lease.seconds)
        return write_final(self.pool, write, claim, fields, patience=patience)


def count_by_type(counter, pool: str, tasks) -> None:
    """One increment per task type rather than per task: each costs a lock and a write."""
    by_type = collections.Counter(task.task_type for task in tasks)
    for task_type, number in by_type.items():
        counter.labels(pool, task_type).inc(number)
