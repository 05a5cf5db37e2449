"""How a worker runs a claimed batch: in order, each task under its own lease and token.

With ``pools.<name>.batch_size`` above 1, one statement claims several due tasks. A claimed
task must not wait long behind a slow handler: once the handler ahead of it has run for
BATCH_HOLD seconds, a guard thread gives the tasks still waiting back (without spending a
retry) for any idle worker to take, and writes the completions already finished.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Sequence

from .. import metrics
from ..channel import MAX_LINKED_ID_LENGTH
from ..config import Config
from ..db import store
from ..errors import PermanentError
from ..lease_timing import stop_margin
from ..logs import emit
from .leases import LeaseHolder
from .outcomes import Done, Outcome, count_by_type
from .task import Task, decode_payload

# A batch's waiting tasks are given back once the handler ahead of them ran this long (or a
# quarter of the lease, if that is shorter).
BATCH_HOLD = 1.0
GUARD_POLL = 0.25


class BatchRunning:
    """The Worker's batch handling: a mixin, because the loop and the guard thread share the
    batch's state (under ``_batch``) with the final writes of Settling."""

    # Set by Worker.__init__.
    config: Config
    leases: LeaseHolder
    worker_id: str
    pool_name: str
    stop_event: threading.Event
    batch_hold: float
    _held: dict[int, Task]
    _batch: threading.Condition
    _waiting: collections.deque[tuple[Task, int]]
    _running_since: float | None
    _done: list[Done]
    _guard: threading.Thread | None
    # Its methods call the Worker's execute, _fields and handler_connection, and Settling's
    # _record, _finalize, _end_lost, refuse and _write_completions.

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
                                 refresh=self.leases.refresh)
            task.lease_expires_at = claimed_at + self.config.lease.seconds
            task.lease_margin = stop_margin(self.config.lease.seconds)
            task.undecodable = error
            batch.append((task, row["lease_token"]))
        batch = self._fail_unlinkable(batch)
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
        count_by_type(metrics.TASKS_CLAIMED, self.pool_name, (task for task, _ in batch))
        for task, token in batch:
            emit("task_claimed", token=token, attempt=task.attempts, **self._fields(task))
        return batch

    def _fail_unlinkable(self, batch: list[tuple[Task, int]]) -> list[tuple[Task, int]]:
        """Fail, once and for good, each claim whose id is too long to report to the
        supervisor; the rest of the batch. Given back instead, it would be claimed again at
        once, forever."""
        kept = []
        for task, token in batch:
            if len(task.id) <= MAX_LINKED_ID_LENGTH:
                kept.append((task, token))
                continue
            fields = {**self._fields(task), "task_id": task.id[:200] + "..."}
            error = PermanentError(f"its id is {len(task.id)} characters long, more than a "
                                   f"worker reports to its supervisor ({MAX_LINKED_ID_LENGTH}); "
                                   "no client writes such an id")
            self._record(token, self._fail(store.Claim(task.id, self.worker_id, token), task,
                                           error, True, fields), task, 0.0)
        return kept

    def _give_back(self, batch: Sequence[tuple[Task, int]], *, reason: str) -> None:
        """Release claims that never started, without spending a retry."""
        if not batch:
            return
        pairs = [(task.id, token) for task, token in batch]
        fields = {"worker_id": self.worker_id, "pool": self.pool_name}
        released = self._finalize(lambda conn: store.release_tasks(conn, pairs),
                                  store.Claim(pairs[0][0], self.worker_id, pairs[0][1]),
                                  {**fields, "tasks": len(pairs)})
        if released is not None:
            # Those not released were lost while they waited (a cancel): they never ran.
            self._end_lost([store.Claim(task.id, self.worker_id, token)
                            for task, token in batch if task.id not in released], fields)
        released = released or set()
        emit("batch_released", reason=reason, tasks=len(pairs), released=len(released),
             **fields)
        for task, token in batch:
            self._record(token, Outcome("released"), task, None)
        # Another worker may claim them at once: renewed in our name meanwhile, the
        # supervisor would find them taken and report our lease lost.
        self.leases.report_settled()

    # -- the batch guard ------------------------------------------------------------------------

    def _guard_batches(self) -> None:
        """Give back a batch's waiting tasks, and write its finished completions, once the
        handler running ahead of them has taken longer than batch_hold; on a stop, give the
        waiting ones back at once, however long the running one takes. A waiting claim the
        worker hears it lost (a cancel) is settled at once: it will never start, and the
        slot a cancel left it (a limited type) goes back now, not when its turn comes."""
        while True:
            with self._batch:
                if self.stop_event.is_set():
                    waiting, self._waiting = list(self._waiting), collections.deque()
                    break
                lost = [(task, token) for task, token in self._waiting
                        if task.cancel_reason is not None]
                if lost:
                    self._waiting = collections.deque(
                        (task, token) for task, token in self._waiting
                        if task.cancel_reason is None)
            if lost:
                self._settle_lost_waiting(lost)
                continue
            with self._batch:
                if self.stop_event.is_set():
                    continue
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
        # The running task's completion, and those before it, are the loop's to write when
        # it stops.
        self._give_back(waiting, reason="the worker is stopping")

    def _settle_lost_waiting(self, lost: list[tuple[Task, int]]) -> None:
        # As a claim found lost at its start: still ours in the database (a supervisor that
        # took a stopped child's claims back, then let it go), it goes back free; cancelled,
        # its slot is given back.
        for task, token in lost:
            self.refuse(store.Claim(task.id, self.worker_id, token), task, token,
                        self._fields(task))

