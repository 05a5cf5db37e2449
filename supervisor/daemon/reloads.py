"""A reload (SIGHUP): a new generation of children with the new config, swapped in whole.

The new config is loaded and every pool's children of the next generation started beside the
running ones. Only once all of them booted is the old generation retired (each child finishes
its current task) and the new config made current. If one of them dies before that, or they
do not all boot within BOOT_TIMEOUT, the reload fails as a whole: the new children are stopped
and the running generation carries on, untouched.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from . import systemd
from .children import BOOT_TIMEOUT, Child, RestartPolicy
from ..config import Config, load_config
from ..errors import ConfigError, one_line
from ..logs import emit, setup_logging
from .services import Services


@dataclass
class Reload:
    generation: int
    config: Config
    deadline: float
    failure: str | None = None  # set when a child of the new generation dies unbooted


class Reloading:
    """The Arbiter's reload steps: a mixin, because a reload swaps the Arbiter's own config,
    generation and targets and starts and stops its children."""

    # Set by Arbiter.__init__.
    config: Config
    generation: int
    children: dict[int, Child]
    targets: dict[str, int]
    restarts: RestartPolicy
    reload: Reload | None
    reload_requested: bool
    services: Services
    # Its methods call the Arbiter's spawn_generation and stop_child.

    def generation_config(self, generation: int) -> Config:
        if self.reload is not None and generation == self.reload.generation:
            return self.reload.config
        return self.config

    def reload_failed(self, reason: str) -> None:
        """Kept until a reload succeeds: the STATUS line, /healthz (a warning) and the
        metrics show it, not only the log."""
        self.reload_failure = reason[:200]
        count_reload("failed")

    def begin_reload(self) -> None:
        try:
            new_config = load_config(self.config.path)
        except ConfigError as exc:
            emit("reload_failed", logging.ERROR, reason="invalid config, keeping the running one",
                 problems=exc.problems)
            self.reload_failed(f"invalid config: {exc.problems[0]}")
            return
        except Exception as exc:  # noqa: BLE001 - no config, however odd, may stop the daemon
            emit("reload_failed", logging.ERROR, reason="the config could not be loaded, "
                 "keeping the running one", problems=[one_line(exc)])
            self.reload_failed(f"the config could not be loaded: {one_line(exc)}")
            return
        for warning in new_config.warnings():
            emit("config_warning", logging.WARNING, warning=warning)
        if new_config.database != self.config.database:
            emit("reload_warning", logging.WARNING,
                 reason="database settings change only on restart; keeping the current database")
        systemd.reloading()
        generation = self.generation + 1
        self.reload = Reload(generation, new_config, time.monotonic() + BOOT_TIMEOUT)
        emit("reload_started", generation=generation,
             pools={p.name: p.processes for p in new_config.pools})
        self.spawn_generation(generation, new_config)

    def advance_reload(self) -> None:
        reload = self.reload
        if reload is None:
            if self.reload_requested:
                self.reload_requested = False
                self.begin_reload()
            return
        newborn = [c for c in self.children.values() if c.generation == reload.generation]
        expected = sum(p.processes for p in reload.config.pools)
        failed = reload.failure
        if failed or time.monotonic() > reload.deadline:
            for child in newborn:
                self.stop_child(child, "reload aborted", grace=self.config.shutdown_timeout)
            emit("reload_failed", logging.ERROR, generation=reload.generation,
                 reason=failed or "the new workers did not boot in time",
                 kept_generation=self.generation)
            self.reload_failed(failed or "the new workers did not boot in time")
            self.reload = None
            systemd.notify("READY=1")
            return
        if sum(1 for c in newborn if c.booted) < expected:
            return
        # Every new child booted: retire the old generation; each finishes its current task.
        for child in list(self.children.values()):
            if child.generation != reload.generation:
                self.stop_child(child, "reload")
        self.config = reload.config
        setup_logging(self.config.logging.level, self.config.logging.format)
        self.generation = reload.generation
        self.targets = {p.name: p.processes for p in reload.config.pools}
        self.restarts.reset()  # a reload is the way to re-arm a fused pool
        self.services.apply(reload.config)
        self.reload = None
        emit("reload_finished", generation=self.generation, pools=dict(self.targets))
        self.reload_failure = None
        count_reload("succeeded")
        systemd.notify("READY=1")


def count_reload(outcome: str) -> None:
    from .. import metrics

    metrics.RELOADS.labels(outcome).inc()
