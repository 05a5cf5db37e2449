"""The claim-run-finalize loop of one worker, the seed's six steps:

  1. claim one due task   2. commit   3. start lease renewal   4. run the handler
  5. stop lease renewal   6. save the final state, conditioned on the claim's fencing token

The handler runs outside any transaction. A final write that changes no row means the claim
was lost (cancelled, or taken over after the lease expired): the result is dropped and logged.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Mapping

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from .. import metrics
from ..channel import ChildChannel
from ..config import Config
from ..db import store
from ..db.connect import with_options
from ..errors import PermanentError, TaskCancelled
from ..logs import emit
from .lease import LeaseRenewer
from .task import Task

_DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)
# How long a final write keeps retrying through a database outage before giving up; past it
# the lease has long expired and the task runs again elsewhere (at-least-once).
MIN_FINALIZE_PATIENCE = 60.0
MAX_LOOP_ERROR_BACKOFF = 10.0
MAX_ERROR_MESSAGE = 4000
RECONNECT_FOREVER = 365 * 24 * 3600.0


@dataclass(frozen=True)
class Outcome:
    """How one run ended, as the pipe and the metrics name it."""
    name: str  # completed | retried | failed | cancelled | stale | lost
    status: str | None = None
    retry_count: int | None = None
    retry_delay: float | None = None


def open_pool(dsn: str, *, connect_timeout: float, name: str, max_size: int = 3,
              application_name: str | None = None) -> ConnectionPool:
    """The child's connections: the loop, the lease thread and a handler borrow from it.

    No ``check`` before lending: testing every checkout costs a round trip, two per task.
    A connection that died (a database restart) fails its next statement instead; the pool
    drops it when it comes back broken, the loop logs one loop_error and the next claim gets
    a fresh connection, and final writes retry on their own.
    """
    return ConnectionPool(
        with_options(dsn, application_name=(application_name or name)[:63],
                     connect_timeout=max(1, int(connect_timeout))),
        min_size=1, max_size=max_size, kwargs={"autocommit": True},
        timeout=connect_timeout, open=False, name=name,
        # Keep trying through a long outage: a worker has nothing better to do, and giving up
        # would leave it unable to claim after the database comes back.
        reconnect_timeout=RECONNECT_FOREVER,
    )


class Worker:
    def __init__(self, config: Config, *, pool: ConnectionPool, handlers: Mapping[str, Callable],
                 worker_id: str, pool_name: str = "default",
                 channel: ChildChannel | None = None, stop_event: threading.Event | None = None,
                 lease_pool: ConnectionPool | None = None):
        self.config = config
        self.pool = pool
        # Renewals get connections of their own, so a handler holding the pool's connections
        # can never starve its own lease.
        self.lease_pool = lease_pool or pool
        self.handlers = dict(handlers)
        self.task_types = tuple(sorted(self.handlers))
        self.worker_id = worker_id
        self.pool_name = pool_name
        self.channel = channel or ChildChannel(None)
        self.stop_event = stop_event or threading.Event()
        self.on_title: Callable[[str], None] = lambda state: None
        self._error_streak = 0

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Claim and run tasks until asked to stop; the current task always finishes first."""
        emit("worker_started", worker_id=self.worker_id, pool=self.pool_name,
             task_types=list(self.task_types))
        while not self.stop_event.is_set():
            try:
                ran = self.run_once()
            except Exception as exc:  # the loop must survive anything but a stop
                self._loop_error(exc)
                continue
            self._error_streak = 0
            if not ran:
                self.stop_event.wait(self.config.poll_interval)
        emit("worker_stopped", worker_id=self.worker_id, pool=self.pool_name)

    def run_once(self) -> Outcome | None:
        """Claim one due task and run it to a final state; None when nothing was due."""
        if not self.task_types:
            return None
        # The database starts the lease at its now(), which is no earlier than this.
        claimed_at = time.monotonic()
        with self.pool.connection() as conn:
            row = store.claim_task(conn, worker_id=self.worker_id, task_types=self.task_types,
                                   lease_seconds=self.config.lease.seconds)
        if row is None:
            return None
        return self.execute(row, claimed_at=claimed_at)

    def _loop_error(self, exc: BaseException) -> None:
        self._error_streak += 1
        metrics.LOOP_ERRORS.labels(self.pool_name).inc()
        emit("loop_error", logging.ERROR, worker_id=self.worker_id, pool=self.pool_name,
             error=_describe(exc), streak=self._error_streak)
        # Back off while the database is away so a hundred workers do not hammer it.
        delay = min(self.config.poll_interval * 2 ** min(self._error_streak, 10),
                    MAX_LOOP_ERROR_BACKOFF)
        self.stop_event.wait(delay)

    # -- one task ---------------------------------------------------------------------------

    def execute(self, row: dict, *, claimed_at: float | None = None) -> Outcome:
        claim = store.Claim(row["id"], self.worker_id, row["lease_token"])
        task = Task.from_row(row, worker_id=self.worker_id, connection=self.pool.connection)
        task.lease_expires_at = (time.monotonic() if claimed_at is None else claimed_at) \
            + self.config.lease.seconds
        fields = self._fields(task)
        metrics.TASKS_CLAIMED.labels(self.pool_name, task.task_type).inc()
        emit("task_claimed", token=claim.token, attempt=row.get("attempts"), **fields)
        self.channel.send("claimed", task_id=task.id, token=claim.token, task_type=task.task_type)
        self.on_title(f"running {task.id}")

        renewer = LeaseRenewer(pool=self.lease_pool, claim=claim, task=task,
                               lease_seconds=self.config.lease.seconds,
                               renew_interval=self.config.lease.renew_interval,
                               pool_name=self.pool_name)
        renewer.start()
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
        finally:
            renewer.stop()
        duration = time.monotonic() - started

        outcome = self._settle(claim, task, error, fields)
        metrics.TASK_DURATION.labels(self.pool_name, task.task_type, outcome.name).observe(duration)
        self.channel.send("done", task_id=task.id, outcome=outcome.name)
        self.on_title("idle")
        return outcome

    def _settle(self, claim: store.Claim, task: Task, error: BaseException | None,
                fields: dict) -> Outcome:
        if error is None:
            # Even if the task stopped being ours while the handler ran, try the write: the
            # token condition decides, and a lost claim drops the result as stale.
            return self._complete(claim, task, fields)
        if isinstance(error, TaskCancelled):
            return self._stopped_by_cancel(claim, task, fields)
        permanent = isinstance(error, PermanentError)
        return self._fail(claim, task, error, permanent, fields)

    def _complete(self, claim, task, fields) -> Outcome:
        done = self._finalize(lambda conn: store.complete_task(conn, claim), claim, fields)
        if done is None:
            return Outcome("lost")
        if done:
            metrics.TASKS_COMPLETED.labels(self.pool_name, task.task_type).inc()
            emit("task_completed", **fields)
            return Outcome("completed", "COMPLETED", task.retry_count)
        return self._stale(claim, task, fields, "completed")

    def _fail(self, claim, task, error, permanent, fields) -> Outcome:
        message = _describe(error)
        detail = message if permanent else _with_origin(error, message)
        # fail_attempt answers None when the claim is not ours; "or False" keeps that apart
        # from _finalize's None, which means the write was given up on.
        result = self._finalize(
            lambda conn: store.fail_attempt(conn, claim, error=detail[:MAX_ERROR_MESSAGE],
                                            permanent=permanent, retry=self.config.retry)
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
            emit("task_failed", logging.ERROR, error=message, permanent=permanent, **fields)
            return Outcome("failed", "FAILED", result["retry_count"])
        delay = None if result["retry_delay"] is None else round(result["retry_delay"], 3)
        metrics.TASKS_RETRIED.labels(self.pool_name, task.task_type).inc()
        emit("task_retry_scheduled", logging.WARNING, error=message, retry_delay=delay, **fields)
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

    # -- durable final writes ---------------------------------------------------------------

    def _finalize(self, write: Callable, claim: store.Claim, fields: dict):
        """Run one conditioned final write, retrying through a connection failure.

        Safe to repeat because the write is conditioned on the fencing token. If a commit went
        through but its answer was lost, the retry changes no row; the token left on the row
        then tells our own earlier write apart from a real loss of ownership.
        """
        patience = max(MIN_FINALIZE_PATIENCE, 2 * self.config.lease.seconds)
        deadline = time.monotonic() + patience
        delay = 0.1
        attempt = 0
        while True:
            attempt += 1
            try:
                with self.pool.connection() as conn:
                    result = write(conn)
                    if attempt > 1 and not result:
                        row = store.task_status(conn, claim.task_id)
                        if row and row["lease_token"] == claim.token \
                                and row["status"] not in ("RUNNING", "CANCELLED"):
                            return AlreadyWritten(row)
                    return result
            except _DB_ERRORS as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    emit("final_state_lost", logging.ERROR, error=_describe(exc),
                         attempts=attempt, **fields)
                    return None
                emit("final_write_retry", logging.WARNING, error=_describe(exc),
                     attempt=attempt, **fields)
                time.sleep(min(delay, left))
                delay = min(delay * 2, 5.0)

    def _fields(self, task: Task) -> dict:
        return {"task_id": task.id, "worker_id": self.worker_id, "task_type": task.task_type,
                "retry_count": task.retry_count, "pool": self.pool_name}


class AlreadyWritten:
    """Our own final write landed on an earlier try whose answer the connection lost."""

    def __init__(self, row: dict):
        self.row = row

    def __bool__(self) -> bool:
        return True


def _storable(text: str) -> str:
    """Text PostgreSQL will take: no NUL, and lone surrogates (a non-UTF-8 file name from
    os.listdir, say) escaped, so that the failure that carries them is still recorded."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(exc: BaseException) -> str:
    text = _storable(str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1]}" if text else type(exc).__name__


def _with_origin(exc: BaseException, message: str) -> str:
    """The message plus where the handler raised it, for error_message."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return message
    last = frames[-1]
    return _storable(f"{message} (at {last.filename}:{last.lineno} in {last.name})")
