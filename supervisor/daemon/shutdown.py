"""The supervisor's shutdown: every child stopped, then their last claims settled.

SIGTERM and SIGINT stop gracefully: each child finishes its current task within
shutdown_timeout, past which it is killed. SIGQUIT kills every child at once. Either way the
supervisor exits only once the lease keeper has settled what the children held, or the
database stayed away for SETTLE_PATIENCE.
"""

from __future__ import annotations

import logging
import time

from . import systemd
from .children import Child
from ..config import Config
from ..logs import emit
from .reloads import Reload

# How long a stopping supervisor waits for the lease keeper to settle its last claims.
SETTLE_PATIENCE = 5.0


class Shutdown:
    """The Arbiter's stop steps: a mixin, because a stop changes how the Arbiter's loop treats
    every child and ends that loop."""

    # Set by Arbiter.__init__.
    config: Config
    children: dict[int, Child]
    stopping: str | None
    children_gone_at: float | None
    reload: Reload | None
    # Its methods call the Arbiter's stop_child, kill_child and murder_stuck, and its keeper
    # (the lease keeper, imported only once the metrics directory is set).

    def begin_stop(self, mode: str, via: str) -> None:
        if self.stopping == "quick" or (self.stopping == mode):
            return
        self.stopping = mode
        systemd.notify("STOPPING=1", f"STATUS=stopping ({via})")
        grace = self.config.shutdown_timeout if mode == "graceful" else 0.0
        emit("supervisor_stopping", mode=mode, signal=via, grace_seconds=grace,
             children=len(self.children))
        self.reload = None
        for child in self.children.values():
            if mode == "quick":
                child.stopping = "shutdown"
                self.kill_child(child)
            else:
                # A child already retiring for a reload now has the shutdown's deadline.
                child.stopping = None
                self.stop_child(child, "shutdown", grace=grace)

    def advance_stop(self) -> bool:
        """Drive the shutdown; True once every child is gone and its claims settled (or the
        database stayed away for SETTLE_PATIENCE)."""
        self.murder_stuck()
        if self.children:
            return False
        unsettled = self.keeper.unsettled()
        if self.children_gone_at is None:
            self.children_gone_at = time.monotonic()
        if unsettled and time.monotonic() - self.children_gone_at < SETTLE_PATIENCE:
            return False
        if unsettled:
            # The leases will expire and another daemon's reaper (or ours, next start)
            # settles these; the shutdown does not hang on the database.
            emit("shutdown_unsettled", logging.WARNING, tasks=unsettled)
        return True
