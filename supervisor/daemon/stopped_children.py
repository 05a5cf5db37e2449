"""A stopped child's claims: those it never started go back at once, free; the runs it
finished are written.

A child stopped by a signal or a debugger (SIGSTOP, SIGTSTP, ptrace) runs nothing, so the
lease keeper no longer renews its claims. The one it was running passes to another worker
once its lease lapses, charged an attempt, as any run whose worker stopped making progress.
The others must not lapse with it: each would be charged an attempt (by the reaper, or by
the claim that takes it over), and a task with max_retries 0 would end FAILED though it
never ran, or though it ran and succeeded. So when the main loop sees a child stopped:

- the runs its claim board shows FINISHED (the handler succeeded, the completion is not
  written yet) are completed by the lease keeper, as for a dead child: the completion is
  conditioned on the child's token, so the child's own write, once it is let go, changes
  nothing;
- the claims it never started (CLAIMED on the board, or not written there yet) go back
  without spending a retry, long before their leases lapse: the child is told each is lost
  (the "lost" message waits in its link), then, if the child is still stopped and the board
  still shows each not started, the lease keeper releases them (conditioned on each token)
  and the child is no longer said to hold them.

A child marks a claim started before it reads its link for losses, and starts it only if
none came (Worker.may_start): so whatever the moment of its SIGCONT, each claim is either
seen started here and left to it, or known lost to it and never started. One let go before
the second look finds the claims lost, and gives back itself those still its own, free too.
"""

from __future__ import annotations

import time
from typing import Iterable

from ..claim_board import CLAIMED, FINISHED
from .children import Child
from ..logs import emit

# How often the main loop looks at the state of each child that holds claims: one read of
# /proc per child, well within the shortest lease a config allows.
CHECK_INTERVAL = 0.25
RELEASED = "given back while its worker was stopped"
COMPLETED = "completed by the supervisor while its worker was stopped"


class StoppedChildren:
    def __init__(self):
        self._checked_at = 0.0

    def settle(self, children: Iterable[Child], keeper) -> None:
        """Settle the finished and never-started claims of every child found stopped."""
        now = time.monotonic()
        if now - self._checked_at < CHECK_INTERVAL:
            return
        self._checked_at = now
        for child in children:
            if child.claims and child.board is not None and child.stopped():
                self._settle(child, keeper)

    def _settle(self, child: Child, keeper) -> None:
        states = child.board.states()
        finished = [t for t in child.claims if states.get(t) == FINISHED]
        completed = keeper.settle_tokens("complete", child, finished, COMPLETED)
        told = [t for t in child.claims if states.get(t, CLAIMED) == CLAIMED
                and child.lost(t, RELEASED)]
        released = []
        if told and child.stopped():
            states = child.board.states()
            waiting = [t for t in told if states.get(t, CLAIMED) == CLAIMED]
            released = keeper.settle_tokens("release", child, waiting, RELEASED)
        for held in completed + released:
            child.claims.pop(held.token, None)
            if held in completed:
                # Its late write will change nothing: the stale result it logs says why.
                child.lost(held.token, COMPLETED)
        if completed or released:
            emit("stopped_worker_claims_settled", pool=child.pool, slot=child.slot,
                 child_pid=child.pid, worker_id=child.worker_id, released=len(released),
                 completed=len(completed),
                 task_ids=[h.task_id for h in (completed + released)[:20]])
