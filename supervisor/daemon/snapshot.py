"""What the daemon is doing, as the registry thread writes it to the database.

The arbiter's loop owns its children and changes them every turn; the registry thread
(maintenance/registry.py) must never read them, nor hold a lock the loop would wait for
while it talks to the database. So the loop builds a DaemonSnapshot, immutable all the way
down, and replaces its reference whole (an atomic store); the registry thread reads
whichever snapshot the reference holds when its heartbeat is due.

A child's tasks come from two sources the loop already has: the claims the child reported
(task id and type, by fencing token) and its claim board, which says of each token whether
its handler runs now (claim_board.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..claim_board import CLAIMED, FINISHED, STARTED
from .children import Child

# The tasks listed per child: a concurrent child may hold a thousand claims, and the row is
# rewritten at every heartbeat. The running ones come first; ``held`` counts them all.
MAX_TASKS_SHOWN = 10

_TASK_STATES = {CLAIMED: "claimed", STARTED: "running", FINISHED: "finished"}


@dataclass(frozen=True)
class ChildTask:
    task_id: str
    task_type: str
    state: str
    """``claimed`` (waiting in its batch), ``running`` (its handler runs) or ``finished``
    (the handler returned, the completion is not written yet)."""


@dataclass(frozen=True)
class ChildSnapshot:
    pool: str
    slot: int
    pid: int
    generation: int
    state: str
    """``booting``, ``idle``, ``working`` or ``stopping``."""
    stopping: str | None
    """Why it was asked to stop (``reload``, ``shrink``, ``shutdown``, ...), or None."""
    held: int
    """How many claims it holds."""
    tasks: tuple[ChildTask, ...]

    def as_json(self) -> dict:
        return {"slot": self.slot, "pid": self.pid, "generation": self.generation,
                "state": self.state, "stopping": self.stopping, "held": self.held,
                "tasks": [{"id": t.task_id, "type": t.task_type, "state": t.state}
                          for t in self.tasks]}


@dataclass(frozen=True)
class DaemonSnapshot:
    generation: int
    state: str
    """``starting`` (the first generation has not booted), ``running``, ``reloading`` or
    ``stopping``."""
    children: tuple[ChildSnapshot, ...] = ()

    def pools(self) -> dict[str, list[dict]]:
        """Pool name -> its children, by slot and generation, as the registry row holds
        them."""
        pools: dict[str, list[dict]] = {}
        for child in sorted(self.children, key=lambda c: (c.pool, c.slot, c.generation)):
            pools.setdefault(child.pool, []).append(child.as_json())
        return pools


def daemon_state(*, ready: bool, reloading: bool, stopping: bool) -> str:
    if stopping:
        return "stopping"
    if reloading:
        return "reloading"
    return "running" if ready else "starting"


def take_snapshot(generation: int, state: str, children: Iterable[Child]) -> DaemonSnapshot:
    """The daemon as it is now. On the arbiter's thread only: it reads the children."""
    return DaemonSnapshot(generation, state, tuple(child_snapshot(c) for c in children))


def child_snapshot(child: Child) -> ChildSnapshot:
    states = child.board.states() if child.board is not None else {}
    tasks = [ChildTask(held.task_id, held.task_type, _TASK_STATES[states.get(token, CLAIMED)])
             for token, held in child.claims.items()]
    tasks.sort(key=lambda t: t.state != "running")  # stable: the batch's order otherwise
    if child.stopping:
        state = "stopping"
    elif not child.booted:
        state = "booting"
    else:
        state = "working" if tasks else "idle"
    return ChildSnapshot(child.pool, child.slot, child.pid, child.generation, state,
                         child.stopping, len(tasks), tuple(tasks[:MAX_TASKS_SHOWN]))
