"""The claim-run-finalize loop of one worker, the seed's six steps:

  1. claim due tasks   2. commit   3. have their leases renewed   4. run each handler
  5. stop renewing     6. save each final state, conditioned on its claim's fencing token

The handler runs outside any transaction. A final write that changes no row means the claim
was lost (cancelled, or taken over after the lease expired): the result is dropped and logged.

Two things make the loop cheap without giving up a guarantee. Completions are written in
the same statement (one round trip, one commit) as the claim of the next tasks, each still
conditioned on its own token; a worker that stops or goes idle writes them first. And with
``pools.<name>.batch_size`` above 1, one statement claims several due tasks, run in order,
each under its own lease and token (batches.py). The final writes and what each outcome
counts and logs are in outcomes.py.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import random
import threading
import time
from typing import Callable, Mapping, Sequence

from psycopg_pool import ConnectionPool

from .. import metrics
from ..config import Config
from ..db import store
from ..db.deadline import within
from ..errors import PermanentError, TaskCancelled, TaskTimedOut, one_line
from ..logs import emit, enter_task, leave_task
from .batches import BATCH_HOLD, BatchRunning
from .concurrent import ConcurrentRunning
from .failures import describe
from .final_writes import DB_ERRORS, STATEMENT_DEADLINE
from .leases import LeaseHolder, LocalLeases
from .outcomes import Done, Outcome, Settling
from .pools import open_pool
from .task import Task
from .usage import RunMeter, current_rss_bytes

MAX_LOOP_ERROR_BACKOFF = 10.0
# Each child recycles after max_tasks_per_child tasks, give or take this fraction.
RECYCLE_JITTER = 0.1
# Connections lent to the handlers of one child at most (task.connection()); more handlers
# wanting one at once wait their turn.
MAX_HANDLER_CONNECTIONS = 16


class Worker(BatchRunning, ConcurrentRunning, Settling):
    def __init__(self, config: Config, *, pool: ConnectionPool, handlers: Mapping[str, Callable],
                 worker_id: str, pool_name: str = "default", batch_size: int = 1,
                 leases: Callable[["Worker"], LeaseHolder] | None = None,
                 handler_dsn: str | None = None, owns_process: bool = False,
                 max_tasks: int | None = None, max_memory_mb: float | None = None,
                 concurrency: int = 1):
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
        # Above 1, the child runs that many claims at once (concurrent.py).
        self.concurrency = max(1, concurrency)
        # The event loop async handlers run on when this worker runs one task at a time.
        self._event_loop: asyncio.AbstractEventLoop | None = None
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
        self._done: list[Done] = []
        self._guard: threading.Thread | None = None
        # run_once() keeps each run's outcome for its caller; the endless loop does not.
        self.keep_outcomes = False
        # `pgtaskd worker`, a debugging loop, prints each failure's traceback on stderr.
        self.print_tracebacks = False
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
            # The batch guard settles a lost claim still waiting in the batch.
            with self._batch:
                self._batch.notify_all()

    def on_wake(self) -> None:
        self.wake_event.set()

    def on_stop(self) -> None:
        self.stop()

    def handler_connection(self):
        """A connection for a handler's own writes (autocommit), as a context manager."""
        if self.handler_dsn is None:
            return self.pool.connection()
        with self._handler_pool_lock:
            if self._handler_pool is None:
                pool = open_pool(self.handler_dsn,
                                 connect_timeout=self.config.database.connect_timeout,
                                 name=f"pgtaskd {self.pool_name} handlers", min_size=0,
                                 max_size=min(max(2, self.concurrency), MAX_HANDLER_CONNECTIONS),
                                 generic_plans=False,
                                 pooled=self.config.database.transaction_pooler)
                pool.open()
                self._handler_pool = pool
        return self._handler_pool.connection()

    def close(self) -> None:
        """Close the handlers' connections (the loop's pool is its creator's to close)."""
        if self._handler_pool is not None:
            self._handler_pool.close()
        if self._event_loop is not None:
            self._event_loop.close()

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
             task_types=list(self.task_types), batch_size=self.batch_size,
             concurrency=self.concurrency)
        metrics.start_worker_counters(self.pool_name, self.task_types)
        self.leases.start()
        try:
            if self.concurrency > 1:
                self.run_concurrently()
            while not self.stop_event.is_set():
                # Cleared before the claim: a wake-up that arrives while it runs is kept.
                self.wake_event.clear()
                since = time.monotonic()
                try:
                    batch = self.claim()
                except Exception as exc:  # the loop must survive anything but a stop
                    self._loop_error(exc, since)
                    continue
                self._claim_succeeded()
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
        elif self.max_memory_bytes is not None and self.tasks_run > 0:
            # Not before its first task: a limit below a fresh child's own size would replace
            # every child the moment it boots, forever.
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

    def _claim_succeeded(self) -> None:
        if self._error_streak:
            emit("loop_recovered", worker_id=self.worker_id, pool=self.pool_name,
                 errors=self._error_streak)
        self._error_streak = 0

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

    def claim(self, limit: int | None = None) -> list[tuple[Task, int]]:
        """Write the completions waiting to be written and claim the next tasks (up to
        ``limit``, else batch_size), in one statement; the claimed tasks with their tokens,
        in the order to run them."""
        limit = self.batch_size if limit is None else limit
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
                        limit=limit, usage=[d.usage for d in done])
                else:
                    landed, rows = set(), store.claim_tasks(
                        conn, worker_id=self.worker_id, task_types=self.task_types,
                        lease_seconds=self.config.lease.seconds, limit=limit)
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

    # -- running ----------------------------------------------------------------------------

    def execute(self, task: Task, token: int) -> None:
        self.guarded(task, token, self._run_and_settle)

    def guarded(self, task: Task, token: int, run: Callable) -> None:
        """``run(claim, task, token, fields)``, with whatever escapes it settled as lost."""
        claim = store.Claim(task.id, self.worker_id, token)
        fields = self._fields(task)
        try:
            run(claim, task, token, fields)
        except Exception as exc:
            self._settle_failed(exc, task, token, fields)

    def _settle_failed(self, exc: BaseException, task: Task, token: int, fields: dict) -> None:
        # A bug on the way to the final write must not leave the claim renewed forever by a
        # living worker: stop renewing it, and its lease expires into the reaper.
        emit("settle_failed", logging.ERROR, error=describe(exc), exc_info=exc, **fields)
        with self._batch:
            self._done = [d for d in self._done if d.claim.token != token]
        self._record(token, Outcome("lost"), task, None)

    def _run_and_settle(self, claim: store.Claim, task: Task, token: int, fields: dict) -> None:
        if not self.begin(claim, task, token, fields):
            return
        self.on_title(f"running {task.id}")
        meter_start = self.meter.start()
        started = time.monotonic()
        error = self._call_handler(task)
        duration = time.monotonic() - started
        usage = self.meter.stop(meter_start)
        self.tasks_run += 1
        if self.owns_process:
            self._kill_leftovers(fields)
        self.end(claim, task, token, fields, error, duration, usage)

    def begin(self, claim: store.Claim, task: Task, token: int, fields: dict) -> bool:
        """Whether the handler may start now; if not, the claim is settled here."""
        watched = self.config.handlers.policy(task.task_type).watched
        if task.undecodable is None and self.may_start(task, token, watched=watched):
            return True
        self.refuse(claim, task, token, fields)
        return False

    def may_start(self, task: Task, token: int, *, watched: bool) -> bool:
        """Mark the claim started, then whether it is still ours to start.

        Marked first: a child that dies from here on is charged an attempt for this claim,
        and only for this one (its batch's waiting claims go back free). Then the link is
        read, for a claim lost while it waited (cancelled, its lease passed on, or given back
        by the supervisor while this child was stopped). In that order, a supervisor giving
        back a stopped child's claims either sees this one started and leaves it, or has
        already told us it is lost (stopped_children.py). Only a run that starts is
        reported, for the supervisor to time it (a type with a timeout or cancel: kill)."""
        self.leases.starting(token)
        self.leases.refresh()
        if task.is_cancelled():
            return False
        self.leases.started(task, token, watched=watched)
        return True

    def refuse(self, claim: store.Claim, task: Task, token: int, fields: dict) -> None:
        """Settle a claim whose handler does not start: a payload that cannot be read fails
        for good; a claim lost before it started goes back free if it is still ours."""
        if task.undecodable is not None:
            error = PermanentError(f"the payload cannot be read as JSON: "
                                   f"{describe(task.undecodable)}")
            self._record(token, self._fail(claim, task, error, True, fields), task, 0.0)
            return
        outcome = self._lost_before_start(claim, task, fields)
        if outcome.name != "released":
            self._record(token, outcome, task, 0.0)
            return
        self._record(token, outcome, task, None)
        # Another worker may claim it at once (as for a batch given back).
        self.leases.report_settled()

    def _call_handler(self, task: Task) -> BaseException | None:
        """Run the handler to its end; what it raised, if anything."""
        handler = self.handlers[task.task_type]
        context = enter_task(task.id, task.task_type, self.worker_id)
        try:
            if inspect.iscoroutinefunction(handler):
                if self._event_loop is None:
                    self._event_loop = asyncio.new_event_loop()
                self._event_loop.run_until_complete(handler(task))
                return None
            result = handler(task)
            if inspect.isawaitable(result) or inspect.isgenerator(result):
                # Calling it did none of its work; recording COMPLETED would lose the task.
                if hasattr(result, "close"):
                    result.close()
                raise PermanentError(f"the handler returned {type(result).__name__} instead of "
                                     "running: handlers must be plain or async def functions")
        except BaseException as exc:  # noqa: BLE001 - a handler's SystemExit is a failure too
            if isinstance(exc, KeyboardInterrupt):
                raise
            return exc
        finally:
            leave_task(context)
        return None

    def end(self, claim: store.Claim, task: Task, token: int, fields: dict,
            error: BaseException | None, duration: float,
            usage: tuple[float | None, int | None]) -> None:
        """Settle a run that is over: a success waits for its completion to be written (no
        database work here), anything else is written now."""
        if task.timed_out and not isinstance(error, PermanentError):
            # The supervisor stopped the run: whatever the handler did after being told, it
            # counts as a failed attempt, so max_retries ends a task that always overruns.
            # What the handler raised, if anything, shows where it was stopped.
            timed_out = TaskTimedOut(task.timed_out)
            timed_out.__cause__ = error
            error = timed_out
        if error is None:
            # Even if the task stopped being ours while the handler ran, the write is tried:
            # the token condition decides, and a lost claim drops the result as stale.
            with self._batch:
                self._done.append(Done(claim, task, fields, duration, usage))
            # Should this child die before the completion is written, the supervisor writes
            # it instead of charging the run.
            self.leases.finished(token)
            return
        if isinstance(error, TaskCancelled) and not isinstance(error, TaskTimedOut):
            outcome = self._stopped_by_cancel(claim, task, fields)
        else:
            outcome = self._fail(claim, task, error, isinstance(error, PermanentError), fields,
                                 usage=usage)
        self._record(token, outcome, task, duration, usage)

    def _fields(self, task: Task) -> dict:
        return {"task_id": task.id, "worker_id": self.worker_id, "task_type": task.task_type,
                "retry_count": task.retry_count, "pool": self.pool_name}
