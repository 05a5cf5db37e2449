"""The claim-run-finalize loop of one worker, the seed's six steps:

  1. claim due tasks   2. commit   3. have their leases renewed   4. run each handler
  5. stop renewing     6. save each final state, conditioned on its claim's fencing token

The handler runs outside any transaction. A final write that changes no row means the claim
was lost (cancelled, or taken over after the lease expired): the result is dropped and logged.

Two things make the loop cheap without giving up a guarantee. Completions are written in
the same statement (one round trip, one commit) as the claim of the next tasks, each still
conditioned on its own token; a worker that stops or goes idle writes them first. And with
``pools.<name>.batch_size`` above 1, one statement claims several due tasks, run in order,
each under its own lease and token. A claimed task must not wait long behind a slow handler:
once the handler ahead of it has run for BATCH_HOLD seconds, the tasks still waiting are
given back (without spending a retry) for any idle worker to take.
"""

from __future__ import annotations

import collections
import inspect
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from psycopg_pool import ConnectionPool

from .. import metrics
from ..config import Config
from ..db import store
from ..db.deadline import within
from ..errors import PermanentError, TaskCancelled, TaskTimedOut, one_line
from ..logs import emit
from .failures import describe, shorten, with_origin
from .final_writes import DB_ERRORS, STATEMENT_DEADLINE, AlreadyWritten, write_final
from .leases import LeaseHolder, LocalLeases
from .pools import open_pool
from .task import Task, decode_payload, stop_margin
from .usage import RunMeter, current_rss_bytes

# How long a final write keeps retrying through a database outage before giving up; past it
# the lease has long expired and the task runs again elsewhere (at-least-once).
MIN_FINALIZE_PATIENCE = 60.0
MAX_LOOP_ERROR_BACKOFF = 10.0
MAX_ERROR_MESSAGE = 4000
# A batch's waiting tasks are given back once the handler ahead of them ran this long (or a
# quarter of the lease, if that is shorter).
BATCH_HOLD = 1.0
GUARD_POLL = 0.25
# Each child recycles after max_tasks_per_child tasks, give or take this fraction.
RECYCLE_JITTER = 0.1


@dataclass(frozen=True)
class Outcome:
    """How one run ended, as the metrics name it."""
    name: str  # completed | retried | failed | cancelled | stale | lost
    status: str | None = None
    retry_count: int | None = None
    retry_delay: float | None = None


@dataclass
class _Done:
    """A run whose handler succeeded, waiting for its completion to be written."""
    claim: store.Claim
    task: Task
    fields: dict
    duration: float
    usage: tuple[float | None, int | None] = (None, None)  # CPU seconds, peak RSS bytes


class Worker:
    def __init__(self, config: Config, *, pool: ConnectionPool, handlers: Mapping[str, Callable],
                 worker_id: str, pool_name: str = "default", batch_size: int = 1,
                 leases: Callable[["Worker"], LeaseHolder] | None = None,
                 handler_dsn: str | None = None, owns_process: bool = False,
                 max_tasks: int | None = None, max_memory_mb: float | None = None):
        self.config = config
        self.pool = pool
        # A worker that is a process of its own (a daemon's child, `pgtaskd worker`) kills
        # what a handler left running after each task and recycles itself; one running
        # inside another program (the tests) must not touch that program's processes.
        self.owns_process = owns_process
        self.meter = RunMeter()
        self.tasks_run = 0
        # Each child draws its own limit, so a pool's children do not recycle in lockstep.
        self.max_tasks = None if max_tasks is None else \
            max(1, round(max_tasks * random.uniform(1 - RECYCLE_JITTER, 1 + RECYCLE_JITTER)))
        self.max_memory_bytes = None if max_memory_mb is None else max_memory_mb * 1024 * 1024
        self.exit_reason = "asked to stop"
        # Connections lent to handlers (task.connection()): a pool of their own, opened on
        # first use, so a handler never holds one the loop needs and never runs with the
        # loop's session settings.
        self.handler_dsn = handler_dsn
        self._handler_pool: ConnectionPool | None = None
        self._handler_pool_lock = threading.Lock()
        self.handlers = dict(handlers)
        self.task_types = tuple(sorted(self.handlers))
        self.worker_id = worker_id
        self.pool_name = pool_name
        self.batch_size = max(1, batch_size)
        # Who renews the leases: the supervisor for a daemon's child, else a keeper thread of
        # this process.
        self.leases: LeaseHolder = leases(self) if leases else LocalLeases(
            pool.conninfo, config, self, worker_id=worker_id, pool_name=pool_name)
        self.stop_event = threading.Event()
        self.wake_event = threading.Event()
        self.on_title: Callable[[str], None] = lambda state: None
        self.batch_hold = min(BATCH_HOLD, config.lease.seconds / 4)
        self._error_streak = 0
        # token -> task, for every claim this worker holds and has not settled yet.
        self._held: dict[int, Task] = {}
        # What the batch guard thread and the loop share, under _batch:
        self._batch = threading.Condition()
        self._waiting: collections.deque[tuple[Task, int]] = collections.deque()
        self._running_since: float | None = None
        self._done: list[_Done] = []
        self._guard: threading.Thread | None = None
        # run_once() keeps each run's outcome for its caller; the endless loop does not.
        self.keep_outcomes = False
        self.outcomes: dict[int, Outcome] = {}

    # -- what the lease holder calls, from its own thread -----------------------------------

    def on_renewed(self, tokens: Sequence[int], expires_at: float) -> None:
        for token in tokens:
            task = self._held.get(token)
            if task is not None:
                task.renewed(expires_at)

    def on_lost(self, token: int, reason: str, timed_out: bool = False) -> None:
        task = self._held.get(token)
        if task is not None:
            if timed_out:
                task.timed_out = reason
            task.mark_lost(reason)

    def on_wake(self) -> None:
        self.wake_event.set()

    def handler_connection(self):
        """A connection for a handler's own writes (autocommit), as a context manager."""
        if self.handler_dsn is None:
            return self.pool.connection()
        with self._handler_pool_lock:
            if self._handler_pool is None:
                pool = open_pool(self.handler_dsn,
                                 connect_timeout=self.config.database.connect_timeout,
                                 name=f"pgtaskd {self.pool_name} handlers", min_size=0,
                                 max_size=2, generic_plans=False,
                                 pooled=self.config.database.transaction_pooler)
                pool.open()
                self._handler_pool = pool
        return self._handler_pool.connection()

    def close(self) -> None:
        """Close the handlers' connections (the loop's pool is its creator's to close)."""
        if self._handler_pool is not None:
            self._handler_pool.close()

    def stop(self) -> None:
        """Finish the current task, write what is done, give back what never started."""
        self.stop_event.set()
        self.wake_event.set()
        self.leases.interrupt()
        with self._batch:
            self._batch.notify_all()

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Claim and run tasks until asked to stop; the current task always finishes first."""
        emit("worker_started", worker_id=self.worker_id, pool=self.pool_name,
             task_types=list(self.task_types), batch_size=self.batch_size)
        self.leases.start()
        try:
            while not self.stop_event.is_set():
                # Cleared before the claim: a wake-up that arrives while it runs is kept.
                self.wake_event.clear()
                since = time.monotonic()
                try:
                    batch = self.claim()
                except Exception as exc:  # the loop must survive anything but a stop
                    self._loop_error(exc, since)
                    continue
                if self._error_streak:
                    emit("loop_recovered", worker_id=self.worker_id, pool=self.pool_name,
                         errors=self._error_streak)
                self._error_streak = 0
                if batch:
                    self.run_batch(batch)
                    self._recycle_if_due()
                elif not self.stop_event.is_set():
                    self.on_title("idle")
                    self.leases.idle(since)
                    self.leases.wait(self.config.poll_interval, self.wake_event)
            self.flush()
        finally:
            self.stop()
            if self._guard is not None:
                self._guard.join(2.0)
            self.leases.stop()
        emit("worker_stopped", worker_id=self.worker_id, pool=self.pool_name)

    def run_once(self) -> Outcome | None:
        """Claim due tasks, run them and write every final state; the outcome of the first
        (None when nothing was due)."""
        self.keep_outcomes = True
        self.outcomes.clear()
        batch = self.claim()
        if not batch:
            return None
        self.run_batch(batch)
        self.flush()
        return self.outcomes.get(batch[0][1])

    def _recycle_if_due(self) -> None:
        """Leave the loop, to be replaced by a fresh child, past max_tasks_per_child or
        max_memory_mb. The tasks of the batch are done; the rest go back to the queue."""
        if not self.owns_process:
            return
        reason = None
        if self.max_tasks is not None and self.tasks_run >= self.max_tasks:
            reason = f"ran {self.tasks_run} tasks (max_tasks_per_child)"
        elif self.max_memory_bytes is not None:
            rss = current_rss_bytes()
            if rss is not None and rss > self.max_memory_bytes:
                reason = (f"resident memory {rss / 1048576:.0f} MiB above "
                          f"{self.max_memory_bytes / 1048576:g} MiB (max_memory_mb)")
        if reason is not None:
            metrics.WORKERS_RECYCLED.labels(self.pool_name, reason.split(" (")[-1].rstrip(")")
                                            ).inc()
            emit("worker_recycling", worker_id=self.worker_id, pool=self.pool_name,
                 reason=reason)
            self.exit_reason = "recycle"
            self.stop()

    def _kill_leftovers(self, fields: dict) -> None:
        killed = self.meter.kill_leftovers()
        if killed:
            emit("leftover_processes_killed", logging.WARNING, processes=killed, **fields)

    def _loop_error(self, exc: BaseException, since: float) -> None:
        self._error_streak += 1
        metrics.LOOP_ERRORS.labels(self.pool_name).inc()
        # Once per outage, not once per retry: the metric counts every error, and the
        # recovery is logged with how many there were.
        if self._error_streak == 1:
            emit("loop_error", logging.ERROR, worker_id=self.worker_id, pool=self.pool_name,
                 error=one_line(exc, typed=True))
        # Back off while the database is away so a hundred workers do not hammer it; as an
        # idle worker, so that the wake relay, once it reaches the database again, cuts the
        # wait short rather than leave the queue unserved for the rest of it.
        delay = min(self.config.poll_interval * 2 ** min(self._error_streak, 10),
                    MAX_LOOP_ERROR_BACKOFF)
        self.leases.idle(since)
        self.leases.wait(delay, self.wake_event)

    # -- claiming ---------------------------------------------------------------------------

    def claim(self) -> list[tuple[Task, int]]:
        """Write the completions waiting to be written and claim the next tasks, in one
        statement; the claimed tasks with their tokens, in the order to run them."""
        with self._batch:
            done, self._done = self._done, []
        if not self.task_types or self.stop_event.is_set():
            self._write_completions(done)
            return []
        # The database starts each lease at its now(), which is no earlier than this.
        claimed_at = time.monotonic()
        try:
            with self.pool.connection() as conn, within(conn, STATEMENT_DEADLINE):
                if done:
                    landed, rows = store.complete_and_claim(
                        conn, [d.claim for d in done], worker_id=self.worker_id,
                        task_types=self.task_types, lease_seconds=self.config.lease.seconds,
                        limit=self.batch_size, usage=[d.usage for d in done])
                else:
                    landed, rows = set(), store.claim_tasks(
                        conn, worker_id=self.worker_id, task_types=self.task_types,
                        lease_seconds=self.config.lease.seconds, limit=self.batch_size)
        except DB_ERRORS:
            # Neither part happened (or, if the answer alone was lost, both did: the
            # completions' retry below finds its own token and counts them as written).
            self._write_completions(done)
            raise
        self._report_completions(done, landed)
        return self._accept(rows, claimed_at)

    def run_claimed(self, rows: list[dict]) -> list[Outcome]:
        """Run tasks claimed elsewhere (by ``store.claim_task``, say) as if this worker had
        claimed them, and write their final states; their outcomes, in order."""
        self.keep_outcomes = True
        self.outcomes.clear()
        batch = self._accept(rows, time.monotonic())
        self.run_batch(batch)
        self.flush()
        return [self.outcomes[token] for _, token in batch]

    def _accept(self, rows: list[dict], claimed_at: float) -> list[tuple[Task, int]]:
        batch = []
        for row in rows:
            try:
                payload = row["payload"]
                row = {**row, "payload": decode_payload(payload) if isinstance(payload, str)
                       else payload}
                error = None
            except (ValueError, RecursionError) as exc:
                row = {**row, "payload": {}}
                error = exc
            task = Task.from_row(row, worker_id=self.worker_id,
                                 connection=self.handler_connection,
                                 refresh=getattr(self.leases, "refresh", None))
            task.lease_expires_at = claimed_at + self.config.lease.seconds
            task.lease_margin = stop_margin(self.config.lease.seconds)
            task.undecodable = error
            batch.append((task, row["lease_token"]))
        if not batch:
            return []
        tokens = [token for _, token in batch]
        for task, token in batch:
            self._held[token] = task
        if not self.leases.hold([task for task, _ in batch], tokens):
            # Nobody would renew these leases: running them could overlap another worker's
            # run once they expire. Give them back instead.
            self._give_back(batch, reason="the supervisor did not take the claims")
            return []
        _count(metrics.TASKS_CLAIMED, self.pool_name, (task for task, _ in batch))
        for task, token in batch:
            emit("task_claimed", token=token, attempt=task.attempts, **self._fields(task))
        return batch

    # -- running ----------------------------------------------------------------------------

    def run_batch(self, batch: list[tuple[Task, int]]) -> None:
        """Run a claimed batch in order. On a stop, the running task finishes and what never
        started goes back to the queue without spending a retry."""
        if len(batch) > 1 and self._guard is None:
            self._guard = threading.Thread(target=self._guard_batches, name="batch-guard",
                                           daemon=True)
            self._guard.start()
        with self._batch:
            self._waiting = collections.deque(batch)
        while True:
            with self._batch:
                if not self._waiting or self.stop_event.is_set():
                    rest, self._waiting = list(self._waiting), collections.deque()
                    break
                task, token = self._waiting.popleft()
                # The guard looks at this every GUARD_POLL; waking it per task would cost a
                # thread switch each.
                self._running_since = time.monotonic()
            try:
                self.execute(task, token)
            finally:
                with self._batch:
                    self._running_since = None
        self._give_back(rest, reason="the worker is stopping")

    def execute(self, task: Task, token: int) -> None:
        claim = store.Claim(task.id, self.worker_id, token)
        fields = self._fields(task)
        try:
            self._run_and_settle(claim, task, token, fields)
        except Exception as exc:
            # A bug on the way to the final write must not leave the claim renewed forever
            # by a living worker: stop renewing it, and its lease expires into the reaper.
            emit("settle_failed", logging.ERROR, error=describe(exc), exc_info=True, **fields)
            with self._batch:
                self._done = [d for d in self._done if d.claim.token != token]
            self._record(token, Outcome("lost"), task, None)

    def _run_and_settle(self, claim: store.Claim, task: Task, token: int, fields: dict) -> None:
        if task.undecodable is not None:
            error = PermanentError(f"the payload cannot be read as JSON: "
                                   f"{describe(task.undecodable)}")
            self._record(token, self._fail(claim, task, error, True, fields), task, 0.0)
            return
        if task.is_cancelled():
            # Lost while it waited in the batch (cancelled, or its lease passed on).
            self._record(token, self._stopped_by_cancel(claim, task, fields), task, 0.0)
            return
        self.on_title(f"running {task.id}")
        if self.config.handlers.policy(task.task_type).watched:
            # The supervisor enforces this type's timeout or kills it on a cancel: it has
            # to know when the run starts and which child runs it.
            self.leases.started(task, token)
        meter_start = self.meter.start()
        started = time.monotonic()
        error: BaseException | None = None
        try:
            result = self.handlers[task.task_type](task)
            if inspect.isawaitable(result) or inspect.isgenerator(result):
                # Calling it did none of its work; recording COMPLETED would lose the task.
                if hasattr(result, "close"):
                    result.close()
                raise PermanentError(f"the handler returned {type(result).__name__} instead of "
                                     "running: handlers must be plain functions")
        except BaseException as exc:  # noqa: BLE001 - a handler's SystemExit is a failure too
            if isinstance(exc, KeyboardInterrupt):
                raise
            error = exc
        duration = time.monotonic() - started
        usage = self.meter.stop(meter_start)
        self.tasks_run += 1
        if self.owns_process:
            self._kill_leftovers(fields)
        if task.timed_out and not isinstance(error, PermanentError):
            # The supervisor stopped the run: whatever the handler did after being told, it
            # counts as a failed attempt, so max_retries ends a task that always overruns.
            error = TaskTimedOut(task.timed_out)
        if error is None:
            # Even if the task stopped being ours while the handler ran, the write is tried:
            # the token condition decides, and a lost claim drops the result as stale.
            with self._batch:
                self._done.append(_Done(claim, task, fields, duration, usage))
            return
        if isinstance(error, TaskCancelled) and not isinstance(error, TaskTimedOut):
            outcome = self._stopped_by_cancel(claim, task, fields)
        else:
            outcome = self._fail(claim, task, error, isinstance(error, PermanentError), fields,
                                 usage=usage)
        self._record(token, outcome, task, duration, usage)

    def _record(self, token: int, outcome: Outcome, task: Task, duration: float | None,
                usage: tuple[float | None, int | None] = (None, None)) -> None:
        """A claim is settled: stop its renewal, count it, remember how it ended."""
        self._held.pop(token, None)
        self.leases.drop([token])
        if duration is not None:
            metrics.TASK_DURATION.labels(self.pool_name, task.task_type,
                                         outcome.name).observe(duration)
        if usage[0] is not None:
            metrics.TASK_CPU.labels(self.pool_name, task.task_type).observe(usage[0])
            metrics.TASK_PEAK_RSS.labels(self.pool_name, task.task_type).observe(usage[1])
        if self.keep_outcomes:
            self.outcomes[token] = outcome

    # -- completions --------------------------------------------------------------------------

    def flush(self) -> None:
        """Write every completion still waiting (the worker stops or runs out of work)."""
        with self._batch:
            done, self._done = self._done, []
        self._write_completions(done)

    def _write_completions(self, done: list[_Done]) -> None:
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

    def _report_completions(self, done: list[_Done], landed: set[int], *,
                            check_own: bool = False) -> None:
        if not done:
            return
        missing = [d for d in done if d.claim.token not in landed]
        if missing and check_own:
            # A retried write: an earlier try may have landed with its answer lost.
            landed = set(landed) | self._own_writes([d.claim for d in missing])
        settled = []
        _count(metrics.TASKS_COMPLETED, self.pool_name,
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
        # fail_attempt answers None when the claim is not ours; "or False" keeps that apart
        # from _finalize's None, which means the write was given up on.
        result = self._finalize(
            lambda conn: store.fail_attempt(conn, claim, error=detail[:MAX_ERROR_MESSAGE],
                                            permanent=permanent, retry=self.config.retry,
                                            cpu_seconds=usage[0], peak_rss_bytes=usage[1])
            or False,
            claim, fields)
        if result is None:
            return Outcome("lost")
        if not result:
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

    def _stopped_by_cancel(self, claim, task, fields) -> Outcome:
        """The handler stopped at a safe point because the task was no longer ours."""
        row = self._finalize(lambda conn: store.task_status(conn, claim.task_id), claim, fields)
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

    def _stale(self, claim, task, fields, result: str) -> Outcome:
        metrics.STALE_RESULTS.labels(self.pool_name, task.task_type).inc()
        emit("stale_result_discarded", logging.WARNING, result=result,
             reason=task.cancel_reason or "claim lost before the final write", token=claim.token,
             **fields)
        return Outcome("stale")

    def _give_back(self, batch: Sequence[tuple[Task, int]], *, reason: str) -> None:
        """Release claims that never started, without spending a retry."""
        if not batch:
            return
        pairs = [(task.id, token) for task, token in batch]
        released = self._finalize(lambda conn: store.release_tasks(conn, pairs),
                                  store.Claim(pairs[0][0], self.worker_id, pairs[0][1]),
                                  {"worker_id": self.worker_id, "pool": self.pool_name,
                                   "tasks": len(pairs)}) or set()
        emit("batch_released", worker_id=self.worker_id, pool=self.pool_name, reason=reason,
             tasks=len(pairs), released=len(released))
        for task, token in batch:
            self._record(token, Outcome("released"), task, None)

    # -- the batch guard ------------------------------------------------------------------------

    def _guard_batches(self) -> None:
        """Give back a batch's waiting tasks, and write its finished completions, once the
        handler running ahead of them has taken longer than batch_hold."""
        while not self.stop_event.is_set():
            with self._batch:
                since = self._running_since
                if since is None or not (self._waiting or self._done):
                    self._batch.wait(GUARD_POLL)
                    continue
                left = since + self.batch_hold - time.monotonic()
                if left > 0:
                    self._batch.wait(min(left, GUARD_POLL))
                    continue
                waiting, self._waiting = list(self._waiting), collections.deque()
                done, self._done = self._done, []
                # Until the next handler starts, this batch is dealt with.
                self._running_since = None
            self._write_completions(done)
            self._give_back(waiting, reason=f"the handler ahead ran over {self.batch_hold:g} s")

    def _finalize(self, write: Callable, claim: store.Claim, fields: dict):
        patience = max(MIN_FINALIZE_PATIENCE, 2 * self.config.lease.seconds)
        return write_final(self.pool, write, claim, fields, patience=patience)

    def _fields(self, task: Task) -> dict:
        return {"task_id": task.id, "worker_id": self.worker_id, "task_type": task.task_type,
                "retry_count": task.retry_count, "pool": self.pool_name}


def _count(counter, pool: str, tasks) -> None:
    """One increment per task type rather than per task: each costs a lock and a write."""
    by_type = collections.Counter(task.task_type for task in tasks)
    for task_type, number in by_type.items():
        counter.labels(pool, task_type).inc(number)
