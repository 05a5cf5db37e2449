"""What the supervisor enforces on a single run: a task type's timeout, and kill-on-cancel.

A child reports the start of each run of a type whose policy asks for either
(``handlers.types.<type>.timeout`` / ``cancel: kill``). Past the timeout the supervisor tells
the child the run timed out (its handler sees ``is_cancelled()``; whatever it does then, the
run is recorded as a failed attempt), sends SIGTERM to the child's process group (so what
the handler started stops too, and the child leaves once the run is settled) and SIGKILL
after TIMEOUT_GRACE; the child is replaced. A cancelled task of a ``cancel: kill`` type has
its child killed at once, within a second of the cancel when the wake-up listener carries
the news, else at the next lease renewal; the task stays CANCELLED.

Other threads (the wake-up listener, the lease keeper) only queue the ids of cancelled tasks
here; the main loop acts on them.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from .children import Child
from ..config import RunPolicy
from ..logs import emit

# How long a timed-out run has, after SIGTERM, to end before its child is killed.
TIMEOUT_GRACE = 5.0


@dataclass
class Running:
    token: int
    task_id: str
    task_type: str
    started_at: float
    policy: RunPolicy

    @property
    def deadline(self) -> float | None:
        if self.policy.timeout is None:
            return None
        return self.started_at + self.policy.timeout


class RunPolicies:
    def __init__(self, policy_of: Callable[[Child, str], RunPolicy]):
        self.policy_of = policy_of
        self._cancelled: collections.deque[str] = collections.deque()

    # -- from the child's link (main loop) --------------------------------------------------

    def started(self, child: Child, message: dict) -> None:
        task_type = str(message["task_type"])
        child.running = Running(int(message["token"]), str(message["task_id"]), task_type,
                                float(message["at"]), self.policy_of(child, task_type))

    def settled(self, child: Child, tokens: Iterable[int]) -> None:
        if child.running is not None and child.running.token in tokens:
            child.running = None

    # -- from any thread -------------------------------------------------------------------

    def cancelled(self, task_id: str) -> None:
        """The database shows this task cancelled (a notification, checked, or a lease
        renewal that found it)."""
        self._cancelled.append(task_id)

    # -- the main loop -----------------------------------------------------------------------

    def next_deadline(self, children: Iterable[Child]) -> float | None:
        deadlines = [c.running.deadline for c in children
                     if c.running is not None and c.running.deadline is not None
                     and c.stopping != "timeout"]
        return min(deadlines) if deadlines else None

    def enforce(self, children: list[Child], kill: Callable[[Child], None]) -> None:
        now = time.monotonic()
        for child in children:
            run = child.running
            if run is None or child.stopping == "timeout" or run.deadline is None \
                    or now < run.deadline:
                continue
            self._time_out(child, run, now)
        while self._cancelled:
            task_id = self._cancelled.popleft()
            for child in children:
                token = child.holding(task_id)
                if token is None:
                    continue
                # At once, not at the next renewal: a claim still waiting in a batch must
                # never start, and a running handler's is_cancelled() turns true now.
                child.lost(token, "cancelled")
                emit("cancel_relayed", task_id=task_id, child_pid=child.pid, pool=child.pool)
                run = child.running
                if run is not None and run.token == token and run.policy.cancel == "kill" \
                        and not child.killed_by_us:
                    from .. import metrics

                    metrics.CANCEL_KILLS.labels(child.pool, run.task_type).inc()
                    emit("task_cancel_killed", task_id=task_id, task_type=run.task_type,
                         worker_id=child.worker_id, child_pid=child.pid, pool=child.pool)
                    child.stopping = "cancel"
                    kill(child)

    def _time_out(self, child: Child, run: Running, now: float) -> None:
        from .. import metrics

        reason = f"timed out after {run.policy.timeout:g} s"
        metrics.TASKS_TIMED_OUT.labels(child.pool, run.task_type).inc()
        emit("task_timed_out", logging.WARNING, task_id=run.task_id, task_type=run.task_type,
             worker_id=child.worker_id, child_pid=child.pid, pool=child.pool,
             timeout=run.policy.timeout)
        child.link.send("lost", token=run.token, reason=reason, timed_out=True)
        child.stopping = "timeout"
        child.timeout_reason = reason
        child.kill_at = now + TIMEOUT_GRACE
        try:
            os.killpg(child.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
