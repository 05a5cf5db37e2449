"""The supervisor: forks and watches the worker children of every pool.

The main thread is the arbiter loop. Signal handlers only queue the signal; the loop
dispatches it to ``handle_<name>``. Each turn the loop reads the children's links, reaps the
children that exited, starts or stops children until every pool has its configured count,
advances a reload in progress, and pings systemd. It never waits on the database: the lease
keeper thread renews every claim the children hold and settles the claims of dead children,
the wake-up relay listens for new work, and the reaper, the health check, retention and
the registry have threads of their own (the registry writes the snapshot of the daemon that
the loop publishes: snapshot.py). The parent never imports handler modules and never hands a
connection to a child.

The Arbiter's methods are its process verbs; the children's messages are read by ChildLinks
(child_links.py), a reload's steps are in reloads.py, the stop sequence in shutdown.py, a
stopped child's claims are settled by stopped_children.py, and what systemd is
told each turn in systemd.py (SystemdReport).
"""

from __future__ import annotations

import collections
import logging
import os
import select
import signal
import time

from .. import __version__, proctitle
from . import systemd
from .child_links import ChildLinks
from .child_stops import ChildStops
from ..claim_board import CLAIMED, FINISHED, STARTED
from .children import (BOOT_TIMEOUT, Child, RestartPolicy, describe_exit, kill_group,
                       signal_name, spawn_child)
from ..config import Config
from ..db.redact import redact_dsn
from ..db.session import database_dsn
from ..errors import EXIT_FAILURE, EXIT_OK, EXIT_SCHEMA, MigrationError, OperationalError
from .open_files import raise_open_files_limit, restore_open_files_limit
from ..logs import emit
from ..process_tree import become_subreaper, kill_orphans
from .reloads import Reload, Reloading
from .run_policies import RunPolicies
from .services import Services, cleanup_metrics_dir, prepare_metrics_dir, wait_for_database
from .shutdown import Shutdown
from .stopped_children import StoppedChildren
from .snapshot import DaemonSnapshot, daemon_state, take_snapshot

LOOP_TICK = 0.5
# After children's messages alone, the rest of the loop runs within this long.
PASS_INTERVAL = 0.05
# The registry's snapshot is rebuilt at most this often (at once when the daemon's state or
# generation changes): it reads every child's claim board.
SNAPSHOT_EVERY = 1.0

SIGNAL_NAMES = {signal.SIGHUP: "hup", signal.SIGTERM: "term", signal.SIGINT: "int",
                signal.SIGQUIT: "quit", signal.SIGTTIN: "ttin", signal.SIGTTOU: "ttou"}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


class Arbiter(ChildStops, Reloading, Shutdown):
    def __init__(self, config: Config, *, migrate_on_start: bool = True, demo: bool = False):
        self.config = config
        self.migrate_on_start = migrate_on_start
        self.demo = demo
        self.generation = 1
        self.children: dict[int, Child] = {}
        # What the relay and the health thread read; replaced whole whenever children change.
        self.children_view: tuple[Child, ...] = ()
        self.restarts = RestartPolicy()
        self.targets = {p.name: p.processes for p in config.pools}
        self.signal_queue: collections.deque[int] = collections.deque()
        self.reload: Reload | None = None
        self.reload_requested = False
        self.stopping: str | None = None  # "graceful" or "quick"
        self.schema_refused: str | None = None  # why, once a newer schema was found
        self.children_gone_at: float | None = None
        self.systemd_report = systemd.SystemdReport()
        self.dsn: str | None = None
        self._wake_r, self._wake_w = os.pipe()
        self.metrics_dir: str | None = None
        self.child_open_files: tuple[int, int] | None = None
        self.services = None
        self.links: ChildLinks | None = None  # once the services run
        self.run_policies = RunPolicies(
            lambda child, task_type: self.generation_config(child.generation)
            .handlers.policy(task_type))
        self.stopped_children = StoppedChildren()
        self.started_at = time.monotonic()
        self.loop_tick = self.started_at
        from ..maintenance.health import ChildrenStatus
        self.children_snapshot = ChildrenStatus(0, sum(self.targets.values()))
        # What the registry thread reads; replaced whole (publish_snapshot).
        self.snapshot = DaemonSnapshot(self.generation, "starting")
        # Why the latest reload failed, until one succeeds (reloads.py).
        self.reload_failure: str | None = None
        self._snapshot_due = 0.0

    # -- lifecycle --------------------------------------------------------------------------

    def run(self) -> int:
        self.child_open_files = raise_open_files_limit()
        proctitle.supervisor_title(self.config.path)
        self.metrics_dir = prepare_metrics_dir()
        self.install_signals()
        emit("supervisor_starting", version=__version__,
             config=str(self.config.path or "(defaults)"),
             database=redact_dsn(self.config.database.dsn), pid=os.getpid())
        for warning in self.config.warnings():  # what check-config prints, for who never ran it
            emit("config_warning", logging.WARNING, warning=warning)
        try:
            with database_dsn(self.config) as dsn:
                self.dsn = dsn
                if not self.config.database.dsn:  # where psql finds it: the URI names the socket
                    emit("embedded_database", data_dir=str(self.config.database.data_dir),
                         dsn=redact_dsn(dsn))
                stop_asked = lambda: any(s in self.signal_queue for s in STOP_SIGNALS)  # noqa: E731
                if not wait_for_database(self.config, dsn, migrate_on_start=self.migrate_on_start,
                                         demo=self.demo, stop_asked=stop_asked):
                    emit("supervisor_stopped", reason="stopped while waiting for the database")
                    return EXIT_OK
                self.services = Services(self.config, dsn, self.metrics_dir,
                                         children=lambda: self.children_view,
                                         children_status=lambda: self.children_snapshot,
                                         loop_age=lambda: time.monotonic() - self.loop_tick,
                                         snapshot=lambda: self.snapshot,
                                         reload_facts=lambda: (self.generation,
                                                               self.reload_failure),
                                         on_cancelled=self.on_cancelled,
                                         on_newer_schema=self.on_newer_schema)
                self.services.start()
                self.links = ChildLinks(self.services, self.run_policies)
                # After an embedded server started: its postmaster, once pg_ctl exited, must
                # not become our child. From here on, what a dead child's handler left
                # running comes to us, and is killed (kill_orphans).
                become_subreaper()
                try:
                    self.loop()
                finally:
                    self.services.stop()
        except MigrationError as exc:
            emit("supervisor_failed", logging.ERROR, error=str(exc))
            systemd.notify("STOPPING=1", f"STATUS=failed: {exc}")
            return EXIT_SCHEMA
        except OperationalError as exc:
            emit("supervisor_failed", logging.ERROR, error=str(exc))
            systemd.notify("STOPPING=1", f"STATUS=failed: {exc}")
            return EXIT_FAILURE
        finally:
            cleanup_metrics_dir(self.metrics_dir)
        if self.schema_refused:
            emit("supervisor_failed", logging.ERROR, error=self.schema_refused)
            return EXIT_SCHEMA
        emit("supervisor_stopped")
        return EXIT_OK

    @property
    def keeper(self):
        return self.services.keeper

    # -- the loop ---------------------------------------------------------------------------

    def loop(self) -> None:
        self.started_at = time.monotonic()
        self.spawn_generation(self.generation, self.config)
        pass_due: float | None = None  # a pass put off after messages alone
        while True:
            self.loop_tick = time.monotonic()  # what /livez reads
            timeout = self.next_deadline()
            if pass_due is not None:
                timeout = min(timeout, max(0.0, pass_due - time.monotonic()))
            if self.wait_for_events(timeout):
                # Only children's messages: a busy pool sends one per task, and a whole pass
                # (reaping, pools, systemd) per message would cost more than the messages.
                now = time.monotonic()
                pass_due = pass_due or now + PASS_INTERVAL
                if now < pass_due:
                    continue
            pass_due = None
            self.dispatch_signals()
            self.reap_children()
            self.run_policies.enforce(list(self.children.values()), self.kill_child)
            self.stopped_children.settle(list(self.children.values()), self.keeper)
            if self.stopping:
                if self.advance_stop():
                    return
            else:
                self.advance_reload()
                self.manage_workers()
                self.murder_stuck()
            self.notify_systemd()
            self.publish_snapshot()

    def next_deadline(self) -> float:
        """Seconds until the loop has something timed to do: a slot's restart, a stopping
        child's SIGKILL. Never longer than LOOP_TICK."""
        now = time.monotonic()
        due = [now + LOOP_TICK] + self.restarts.next_starts(now)
        due += [c.kill_at for c in self.children.values() if c.kill_at and not c.killed_by_us]
        run_deadline = self.run_policies.next_deadline(self.children.values())
        if run_deadline is not None:
            due.append(run_deadline)
        return max(0.0, min(due) - now)

    def wait_for_events(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for a signal, a wake-up or a child's message, and read the
        messages; True if messages were all there was."""
        links = {c.link.fileno(): c for c in self.children.values() if not c.link.closed}
        # poll(), not select(): the supervisor's descriptors may go past 1023 (FD_SETSIZE)
        # now that its open-files limit is raised.
        poller = select.poll()
        for fd in (self._wake_r, *links):
            poller.register(fd, select.POLLIN)
        try:
            ready = poller.poll(timeout * 1000)
        except InterruptedError:
            return False
        for fd, _ in ready:
            if fd == self._wake_r:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
            elif fd in links:
                self.links.read(links[fd])
        return bool(ready) and all(fd != self._wake_r for fd, _ in ready)

    def on_newer_schema(self, reason: str) -> None:
        """The health check found a migration this code does not know (called from its
        thread): stop as for SIGTERM, letting running tasks finish, and exit EXIT_SCHEMA."""
        if self.schema_refused is None:
            self.schema_refused = reason
            emit("schema_newer", logging.ERROR, error=reason)
            self.wake()

    def on_cancelled(self, task_id: str) -> None:
        """The database shows this task CANCELLED (called from the listener or the lease
        keeper): the main loop tells the child holding it, or kills it for a cancel: kill
        type."""
        self.run_policies.cancelled(task_id)
        self.wake()
    # -- signals ----------------------------------------------------------------------------

    def install_signals(self) -> None:
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)
        for signum in SIGNAL_NAMES:
            signal.signal(signum, self.signal_handler)
        # A child's exit only needs the loop awake: reap_children() finds it.
        signal.signal(signal.SIGCHLD, lambda signum, frame: self.wake())

    def signal_handler(self, signum, frame) -> None:
        """Signal handler: NO LOGGING, just queue the signal and wake the loop."""
        self.signal_queue.append(signum)
        self.wake()

    def wake(self) -> None:
        """Make the loop's poll() return now. Safe inside a signal handler."""
        try:
            os.write(self._wake_w, b"!")
        except (BlockingIOError, OSError):
            pass

    def dispatch_signals(self) -> None:
        if self.schema_refused and not self.stopping:
            self.begin_stop("graceful", "newer schema")
        while self.signal_queue:
            signum = self.signal_queue.popleft()
            getattr(self, "handle_" + SIGNAL_NAMES[signum])()

    def handle_hup(self) -> None:
        if self.stopping:
            return
        if self.reload is not None:
            emit("reload_deferred", reason="a reload is already in progress")
            self.reload_requested = True
            return
        self.begin_reload()

    def handle_term(self) -> None:
        self.begin_stop("graceful", "SIGTERM")

    def handle_int(self) -> None:
        self.begin_stop("graceful", "SIGINT")

    def handle_quit(self) -> None:
        self.begin_stop("quick", "SIGQUIT")

    def handle_ttin(self) -> None:
        for name in self.targets:
            self.targets[name] += 1
        emit("pools_resized", targets=dict(self.targets), signal="SIGTTIN")

    def handle_ttou(self) -> None:
        for name in self.targets:
            self.targets[name] = max(0, self.targets[name] - 1)
        emit("pools_resized", targets=dict(self.targets), signal="SIGTTOU")

    # -- children ---------------------------------------------------------------------------

    def spawn_worker(self, pool: str, slot: int, generation: int) -> Child | None:
        child = spawn_child(self.generation_config(generation), pool, slot, generation,
                            dsn=self.dsn, metrics_dir=self.metrics_dir)
        if child is not None:
            restore_open_files_limit(child.pid, self.child_open_files)
            self.children[child.pid] = child
            self.children_view = tuple(self.children.values())
        return child

    def spawn_generation(self, generation: int, config: Config) -> None:
        for pool in config.pools:
            for slot in range(1, pool.processes + 1):
                self.spawn_worker(pool.name, slot, generation)

    def live_children(self, pool: str, generation: int | None = None) -> list[Child]:
        generation = self.generation if generation is None else generation
        return [c for c in self.children.values()
                if c.pool == pool and c.generation == generation and not c.stopping]

    def manage_workers(self) -> None:
        """Start or stop children until each pool of the current generation has its count."""
        now = time.monotonic()
        for pool in self.config.pools:
            live = self.live_children(pool.name)
            target = self.targets.get(pool.name, pool.processes)
            if len(live) > target:
                # Shrink by stopping the oldest first: the youngest have the freshest state.
                for child in sorted(live, key=lambda c: c.started)[:len(live) - target]:
                    self.stop_child(child, "shrink")
                continue
            used = {c.slot for c in live}
            for slot in range(1, target + 1):
                if len(used) >= target:
                    break
                if slot in used or not self.restarts.may_start(pool.name, slot, now):
                    continue
                if self.spawn_worker(pool.name, slot, self.generation):
                    used.add(slot)

    def reap_children(self) -> None:
        """Collect every exited child: log how it ended, settle its claims, plan its restart.

        Each child is polled by its own pid, not waitpid(-1): the supervisor runs other
        subprocesses (pg_ctl, the handler import probe) whose statuses are not ours to take.
        """
        for child in list(self.children.values()):
            code = child.process.poll()
            if code is None:
                continue
            # Its pid is free from here on; claims made later under its worker id are not its.
            child.exited_at = time.monotonic()
            # Whatever the child sent before it died (a last "done") must count.
            self.links.read(child)
            child.link.close()
            del self.children[child.pid]
            self.children_view = tuple(self.children.values())
            self.on_child_exit(child, code)

    def on_child_exit(self, child: Child, code: int) -> None:
        from prometheus_client import multiprocess

        from .. import metrics

        multiprocess.mark_process_dead(child.pid, self.metrics_dir)
        if self.services.metrics_archive is not None:
            self.services.metrics_archive.child_died(child.pid)  # folded on the archive's thread
        lived = time.monotonic() - child.started
        how = describe_exit(code, sent_by_us=child.killed_by_us)
        expected = child.stopping is not None and code == 0
        # Whatever its handlers started and left behind must not outlive it, whether or not
        # it held a task: its process group, and what left that group (setsid) and came to
        # us when the child died.
        kill_group(child)
        kill_orphans(set(self.children))
        emit("worker_exited", logging.INFO if expected else logging.ERROR, pool=child.pool,
             slot=child.slot, child_pid=child.pid, exit=how, lived_seconds=round(lived, 3),
             booted=child.booted, stopping=child.stopping,
             task_id=child.task_in_hand())
        self.settle_claims(child, how)
        if child.stopping:
            return
        if child.generation != self.generation:
            # A child of a reload in progress: the reload fails as a whole, nothing restarts.
            if self.reload is not None and child.generation == self.reload.generation:
                when = "during the reload" if child.booted else "before booting"
                self.reload.failure = (f"new worker {child.label} exited {when} "
                                       f"({how}): {child.boot_error or 'see its log'}")
            return
        metrics.WORKER_RESTARTS.labels(child.pool).inc()
        self.restarts.child_exited(child, how, lived, code)

    def settle_claims(self, child: Child, how: str) -> None:
        """The claims a dead child held, handed to the lease keeper's thread, each settled by
        what the child wrote of it on its claim board: a run whose handler succeeded is
        completed; the run it was in counts as a failed attempt at once (no waiting for the
        lease to expire), unless we stopped it on purpose (a shutdown): then it is released;
        a claim it never started goes back without spending a retry. So do the claims it
        made and died before telling us of. A claim cancelled before it died (its cancel:
        kill, say) is settled with the others: its write changes nothing, and the slot the
        cancel left it for its run goes back (lease_keeper)."""
        # Not imported at the top: it imports prometheus_client, which must wait until the
        # metrics directory is set.
        from ..lease_keeper import Unheard

        held = self.keeper.drop_holder(child)
        state = child.board.states() if child.board is not None else {}
        if child.board is not None:
            child.board.close()
            child.board = None
        stopped_on_purpose = child.stopping in ("shutdown", "reload aborted") and child.killed_by_us
        if child.worker_id:
            # A child killed between a claim's commit and its message holds tasks we never
            # heard of: look for them (after the settlements below, in the keeper's order).
            lease = child.config.lease
            unheard = Unheard(child.worker_id, child.pool, child, died_at=child.exited_at,
                              known_tokens=frozenset(h.token for h in held), states=state,
                              running_kind="release" if stopped_on_purpose else "rescue",
                              lease_seconds=lease.seconds, renew_interval=lease.renew_interval)
        else:
            unheard = None
        reason, outcome = self.death_reason(child, how)
        ending = {"outcome": outcome, "signal": signal_name(child.process.returncode)}
        self._settle_held(held, state, stopped_on_purpose, reason, ending)
        if unheard is not None:
            self.keeper.settle_unheard(unheard, reason, **ending)

    def _settle_held(self, held, state, stopped_on_purpose: bool, reason: str,
                     ending: dict) -> None:
        if not held:
            return
        finished = [h for h in held if state.get(h.token) == FINISHED]
        running = [h for h in held if state.get(h.token) == STARTED]
        # Not written yet (the child died between its claim and the board), or never started.
        waiting = [h for h in held if state.get(h.token, CLAIMED) == CLAIMED]
        self.keeper.settle("complete", finished, "completed")
        self.keeper.settle("release", waiting, "release")
        if stopped_on_purpose:
            self.keeper.settle("release", running, "release")
        else:
            self.keeper.settle("rescue", running, reason, **ending)

    def death_reason(self, child: Child, how: str) -> tuple[str, str]:
        """Why the run a dead child was in failed: the task's error, and the outcome its
        failed attempt records (timeout, killed, crashed)."""
        worker = child.worker_id or child.label
        if child.stopping == "timeout":
            return f"worker {worker} killed: its task {child.timeout_reason}", "timeout"
        if child.unheard:
            return (f"worker {worker} killed: its link to the supervisor closed while it ran "
                    "the task (a handler closed its descriptors?)", "killed")
        if child.stopping in ("reload", "shrink") and child.killed_by_us \
                and child.stop_grace is not None:
            # The grace it was stopped with: a reload may have changed reload_timeout (or
            # removed it) since.
            return (f"worker {worker} killed: its task outlasted reload_timeout "
                    f"({child.stop_grace:g} s) during a {child.stopping}", "killed")
        return f"worker {worker} died ({how}) while running the task", "crashed"

    # -- status -----------------------------------------------------------------------------

    def children_status(self):
        from ..maintenance.health import ChildrenStatus

        live = sum(1 for c in self.children.values()
                   if c.generation == self.generation and c.booted and not c.stopping)
        return ChildrenStatus(live, sum(self.targets.values()), self.restarts.fused_pools())

    def notify_systemd(self) -> None:
        status = self.children_status()
        # The health thread reads this reference; replacing it whole is atomic.
        self.children_snapshot = status
        health = self.services.health if self.services is not None else None
        self.systemd_report.send(status, self.children.values(), stopping=self.stopping,
                                 started_at=self.started_at, boot_timeout=BOOT_TIMEOUT,
                                 health=health, reload_failure=self.reload_failure)

    def publish_snapshot(self) -> None:
        """Replace the snapshot the registry thread writes, if it is due or the daemon's
        state or generation changed; a change also wakes the registry, so that it shows at
        once rather than at the next heartbeat."""
        state = daemon_state(ready=self.systemd_report.ready_sent,
                             reloading=self.reload is not None, stopping=bool(self.stopping))
        now = time.monotonic()
        changed = (state, self.generation) != (self.snapshot.state, self.snapshot.generation)
        if not changed and now < self._snapshot_due:
            return
        self.snapshot = take_snapshot(self.generation, state, self.children.values())
        self._snapshot_due = now + SNAPSHOT_EVERY
        if changed and self.services is not None:
            self.services.registry.wake()
