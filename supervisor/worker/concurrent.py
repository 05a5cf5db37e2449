"""A child that runs many claims at once (``pools.<name>.concurrency`` above 1).

The loop thread keeps the seed's steps: it writes the completions waiting to be written and
claims as many due tasks as there is room for, in one statement, then hands each claim to a
runner and goes back to waiting for room, a wake-up or the poll. Plain handlers run on a
pool of ``concurrency`` threads; ``async def`` handlers run on one event loop in a thread of
its own, as many at once as there is room for. Each claim keeps its own lease, token, cancel
flag and claim-board slot, and the supervisor still renews every lease from outside this
interpreter, so neither the GIL nor a busy event loop can starve a renewal.

Final writes are blocking database calls. A thread runner makes them on its own thread; the
event loop never does: a success only queues its completion (it rides on the next claim),
and a failure or a cancellation is written by a small pool of settling threads.

What cannot be kept per task is refused by the config: a thread cannot be killed, so a type
with a ``timeout`` or ``cancel: kill`` needs a pool of concurrency 1. CPU is measured per
thread for plain handlers (the handler's own thread, without the subprocesses it waited
for); an async handler's steps interleave with the others' on one thread, so its CPU is not
recorded, nor is any run's peak memory (the process's high-water mark is everyone's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
import time
from typing import Callable, Mapping

from ..config import Config
from ..db import store
from ..logs import enter_task, leave_task
from .leases import LeaseHolder
from .task import Task

# Threads that write the failures and cancellations of async runs: such writes are rare next
# to completions, and each holds one of the loop pool's connections while it lasts.
SETTLING_THREADS = 4


class ConcurrentRunning:
    """The Worker's concurrent mode: a mixin, for the loop's claim, begin (may_start and
    refuse), end and settling."""

    # Set by Worker.__init__.
    config: Config
    leases: LeaseHolder
    handlers: Mapping[str, Callable]
    concurrency: int
    worker_id: str
    pool_name: str
    owns_process: bool
    stop_event: threading.Event
    wake_event: threading.Event
    tasks_run: int

    def run_concurrently(self) -> None:
        """Claim into free room and run until asked to stop; then let every running task
        finish and write what is done."""
        self._flight = threading.Condition()
        self._in_flight = 0
        self._swept = True  # nothing ran since the leftovers were last killed
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._settlers: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop_thread: EventLoopThread | None = None
        try:
            self._claim_into_room()
        finally:
            self._wait_for_flight(0)
            self._sweep_leftovers()
            if self._loop_thread is not None:
                self._loop_thread.close()
            for pool in (self._threads, self._settlers):
                if pool is not None:
                    pool.shutdown(wait=True)

    def _claim_into_room(self) -> None:
        while not self.stop_event.is_set():
            # Cleared before the room is read: a task that ends from here on sets it again.
            self.wake_event.clear()
            with self._flight:
                room = self.concurrency - self._in_flight
            if room <= 0:
                self.leases.wait(self.config.poll_interval, self.wake_event)
                continue
            if room == self.concurrency:
                self._sweep_leftovers()
            since = time.monotonic()
            try:
                batch = self.claim(limit=room)
            except Exception as exc:  # the loop must survive anything but a stop
                self._loop_error(exc, since)
                continue
            self._claim_succeeded()
            if batch and self.stop_event.is_set():
                # Asked to stop while the claim ran: these never started.
                self._give_back(batch, reason="the worker is stopping")
                break
            for task, token in batch:
                self._launch(task, token)
            self._title()
            self._recycle_if_due()
            if len(batch) < room and not self.stop_event.is_set():
                # The queue had no more for us: wait for a wake-up, a run's end or the poll.
                self.leases.idle(since)
                self.leases.wait(self.config.poll_interval, self.wake_event)

    def _launch(self, task: Task, token: int) -> None:
        with self._flight:
            self._in_flight += 1
            self._swept = False
        if inspect.iscoroutinefunction(self.handlers[task.task_type]):
            if self._loop_thread is None:
                self._loop_thread = EventLoopThread(f"{self.pool_name}-event-loop")
            self._loop_thread.submit(self._run_async(task, token))
        else:
            if self._threads is None:
                self._threads = concurrent.futures.ThreadPoolExecutor(
                    self.concurrency, thread_name_prefix=f"{self.pool_name}-task")
            self._threads.submit(self._run_in_thread, task, token)

    def _landed(self) -> None:
        """A run is over and settled (or its completion queued): there is room again."""
        with self._flight:
            self._in_flight -= 1
            self.tasks_run += 1
            self._flight.notify_all()
        self.wake_event.set()
        self.leases.interrupt()

    def _wait_for_flight(self, at_most: int) -> None:
        with self._flight:
            while self._in_flight > at_most:
                self._flight.wait(0.5)

    # -- the two runners ----------------------------------------------------------------------

    def _run_in_thread(self, task: Task, token: int) -> None:
        try:
            self.guarded(task, token, self._run_on_this_thread)
        finally:
            self._landed()

    def _run_on_this_thread(self, claim: store.Claim, task: Task, token: int,
                            fields: dict) -> None:
        if not self.begin(claim, task, token, fields):
            return
        cpu_started = time.thread_time()
        started = time.monotonic()
        error = self._call_handler(task)
        duration = time.monotonic() - started
        self.end(claim, task, token, fields, error, duration,
                 (round(max(time.thread_time() - cpu_started, 0.0), 6), None))

    async def _run_async(self, task: Task, token: int) -> None:
        claim = store.Claim(task.id, self.worker_id, token)
        fields = self._fields(task)
        try:
            if task.undecodable is not None or not self.may_start(task, token, watched=False):
                # Settled by a write to the database: not on the loop.
                await self._settling(self.refuse, claim, task, token, fields)
                return
            started = time.monotonic()
            error: BaseException | None = None
            # This asyncio task's own context: the other runs on the loop keep theirs.
            enter_task(task.id, task.task_type, self.worker_id)
            try:
                await self.handlers[task.task_type](task)
            except BaseException as exc:  # noqa: BLE001 - as a plain handler's
                if isinstance(exc, KeyboardInterrupt):
                    raise
                error = exc
            finally:
                leave_task()
            duration = time.monotonic() - started
            if error is None and not task.timed_out:
                self.end(claim, task, token, fields, None, duration, (None, None))
            else:
                await self._settling(self.end, claim, task, token, fields, error, duration,
                                     (None, None))
        except Exception as exc:
            await self._settling(self._settle_failed, exc, task, token, fields)
        finally:
            self._landed()

    async def _settling(self, function: Callable, *args) -> None:
        if self._settlers is None:
            self._settlers = concurrent.futures.ThreadPoolExecutor(
                SETTLING_THREADS, thread_name_prefix=f"{self.pool_name}-settle")
        await asyncio.get_running_loop().run_in_executor(self._settlers, function, *args)

    # -- between runs ---------------------------------------------------------------------------

    def _sweep_leftovers(self) -> None:
        """Kill what handlers left running, once no task runs: while one does, a process
        of this child's may be that task's own."""
        if not self.owns_process or self._swept:
            return
        with self._flight:
            if self._in_flight:
                return
            self._swept = True
        self._kill_leftovers({"worker_id": self.worker_id, "pool": self.pool_name})

    def _title(self) -> None:
        with self._flight:
            running = self._in_flight
        self.on_title(f"running {running}/{self.concurrency}" if running else "idle")


class EventLoopThread:
    """One asyncio event loop, run by a thread of its own, for a child's async handlers."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coroutine) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self) -> None:
        """Stop the loop once every run submitted has ended (the caller waited for them)."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            try:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()
