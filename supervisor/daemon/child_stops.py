"""How the supervisor stops a child: asked, then killed when it cannot or will not go.

A child is asked twice, by SIGTERM and by a "stop" on its link, since a handler may set
SIGTERM to SIG_IGN. A shutdown kills it after its grace; a reload or shrink waits for its
task unless reload_timeout is set. A child asked to stop that holds no claim and is still
there after IDLE_STOP_GRACE is killed (it heard neither request); a child whose link closed
while it lives can report nothing, and is stopped and killed after UNHEARD_GRACE.
"""

from __future__ import annotations

import logging
import signal
import time

from .children import (BOOT_TIMEOUT, IDLE_STOP_GRACE, UNHEARD_AFTER, UNHEARD_GRACE, Child,
                       kill_group)
from ..config import Config
from ..logs import emit


class ChildStops:
    """The Arbiter's child stops: a mixin, as they set the state its loop reads per child."""

    # Set by Arbiter.__init__.
    config: Config
    children: dict[int, Child]

    def stop_child(self, child: Child, reason: str, *, grace: float | None = None) -> None:
        """Ask a child to finish its current task and exit.

        A shutdown kills it after ``grace`` (shutdown_timeout by default). A reload or a
        shrink waits for the running task however long it takes, unless ``reload_timeout``
        is set: only then is the child killed, and its run counts as a failed attempt.
        """
        if child.stopping:
            return
        child.stopping = reason
        if reason == "shutdown":
            grace = self.config.shutdown_timeout if grace is None else grace
        elif grace is None:
            grace = self.config.reload_timeout
        child.stop_grace = grace
        child.stop_asked = time.monotonic()
        child.kill_at = None if grace is None else child.stop_asked + grace
        try:
            child.process.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        # After the signal: a child that left at once on the message could take the signal
        # while its interpreter exits, its handler reset, and die of it.
        child.link.send("stop")

    def kill_child(self, child: Child) -> None:
        child.killed_by_us = True
        kill_group(child)

    def murder_stuck(self) -> None:
        """SIGKILL children past their stop grace, and children that never booted."""
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.kill_at is not None and now >= child.kill_at and not child.killed_by_us:
                emit("worker_stop_timeout", logging.WARNING, pool=child.pool, slot=child.slot,
                     child_pid=child.pid, stopping=child.stopping,
                     task_id=child.task_in_hand())
                self.kill_child(child)
            elif not child.booted and not child.stopping and not child.waiting_db \
                    and now - child.started > BOOT_TIMEOUT:
                child.boot_error = f"did not boot within {BOOT_TIMEOUT:g} s"
                self.kill_child(child)
            elif child.link_closed_at is not None and not child.unheard \
                    and now - child.link_closed_at > UNHEARD_AFTER \
                    and child.process.poll() is None:
                child.unheard = True
                emit("worker_link_lost", logging.WARNING, pool=child.pool, slot=child.slot,
                     child_pid=child.pid, task_id=child.task_in_hand(), kill_in=UNHEARD_GRACE)
                self.stop_child(child, "link lost", grace=UNHEARD_GRACE)
                child.kill_at = min(child.kill_at or now + UNHEARD_GRACE, now + UNHEARD_GRACE)
            elif child.stopping and child.kill_at is None and not child.claims \
                    and now - (child.stop_asked or now) > IDLE_STOP_GRACE:
                emit("worker_stop_unheeded", logging.WARNING, pool=child.pool, slot=child.slot,
                     child_pid=child.pid, stopping=child.stopping, waited=IDLE_STOP_GRACE)
                self.kill_child(child)
