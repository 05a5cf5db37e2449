"""The supervisor: forks and watches the worker children of every pool.

The main thread is the arbiter loop. Signal handlers only queue the signal; the loop
dispatches it to ``handle_<name>``. Each turn the loop reads the children's pipes, reaps the
children that exited (rescuing the task a dead child held), starts or stops children until
every pool has its configured count, advances a reload in progress, and pings systemd.

Children start as fresh interpreters (``python -m supervisor.worker.main``) through
subprocess, which forks and execs at once: a bare fork of this threaded process could copy a
lock some other thread holds. A fresh interpreter is also what makes SIGHUP load new handler
code. The parent never imports handler modules and never hands a connection to a child.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psycopg

from . import proctitle, systemd
from .channel import LineReader
from .config import CONFIG_SNAPSHOT_ENV, DSN_ENV, Config, load_config
from .db import store
from .db.connect import LazyConnection, redact_dsn
from .db.migrate import migrate
from .db.session import database_dsn
from .errors import EXIT_FAILURE, EXIT_OK, ConfigError, MigrationError, OperationalError
from .logs import emit

# A child that does not say "booted" within this long is killed and counts as a boot failure.
BOOT_TIMEOUT = 60.0
# Restart backoff per slot: doubles per consecutive early death, capped, with jitter.
RESTART_BASE_DELAY = 0.1
RESTART_MAX_DELAY = 30.0
# A child that lived this long resets its slot's backoff.
STABLE_AFTER = 10.0
# Fuse: this many boot failures within the window stop a pool's restarts.
FUSE_FAILURES = 5
FUSE_WINDOW = 60.0
# Database start-up: how long the supervisor waits for PostgreSQL before giving up.
STARTUP_DB_PATIENCE = 60.0
LOOP_TICK = 0.5

SIGNAL_NAMES = {signal.SIGHUP: "hup", signal.SIGTERM: "term", signal.SIGINT: "int",
                signal.SIGQUIT: "quit", signal.SIGTTIN: "ttin", signal.SIGTTOU: "ttou"}


@dataclass
class Child:
    process: subprocess.Popen
    pool: str
    slot: int
    generation: int
    read_fd: int
    started: float = field(default_factory=time.monotonic)
    reader: LineReader = field(default_factory=LineReader)
    booted: bool = False
    worker_id: str | None = None
    claim: dict | None = None  # {"task_id", "token", "task_type"} while it runs a task
    stopping: str | None = None  # why it was asked to stop: "shrink", "reload", "shutdown"
    kill_at: float | None = None  # when a stopping child gets SIGKILL
    killed_by_us: bool = False
    boot_error: str | None = None
    waiting_db: bool = False  # booting, but waiting out a database outage: not stuck

    @property
    def pid(self) -> int:
        return self.process.pid

    def label(self) -> str:
        return f"{self.pool}#{self.slot}"


@dataclass
class SlotState:
    failures: int = 0
    next_start: float = 0.0


@dataclass
class PoolState:
    boot_failures: collections.deque = field(default_factory=collections.deque)
    fused: bool = False
    last_error: str | None = None


@dataclass
class Reload:
    generation: int
    config: Config
    deadline: float
    failure: str | None = None  # set when a child of the new generation dies unbooted


class Arbiter:
    def __init__(self, config: Config, *, migrate_on_start: bool = True, demo: bool = False):
        self.config = config
        self.migrate_on_start = migrate_on_start
        self.demo = demo
        self.generation = 1
        self.children: dict[int, Child] = {}
        self.slots: dict[tuple[str, int], SlotState] = collections.defaultdict(SlotState)
        self.pool_states: dict[str, PoolState] = collections.defaultdict(PoolState)
        self.targets = {p.name: p.processes for p in config.pools}
        self.signal_queue: collections.deque[int] = collections.deque()
        self.reload: Reload | None = None
        self.reload_requested = False
        self.pending_rescues: list[tuple[Child, str]] = []
        self.next_rescue_at = 0.0
        self.rescue_failures = 0
        self.stopping: str | None = None  # "graceful" or "quick"
        self.ready_sent = False
        self.dsn: str | None = None
        self._db: LazyConnection | None = None
        self._wake_r, self._wake_w = os.pipe()
        self.metrics_dir: str | None = None
        self.services: list = []
        self.http = None
        self._last_watchdog = 0.0
        self._last_status = ""
        self.started_at = time.monotonic()
        self.health = None
        from .maintenance.health import ChildrenStatus
        self.children_snapshot = ChildrenStatus(0, sum(self.targets.values()))

    # -- lifecycle --------------------------------------------------------------------------

    def run(self) -> int:
        proctitle.supervisor_title(self.config.path)
        self.prepare_metrics_dir()
        self.install_signals()
        emit("supervisor_starting", config=str(self.config.path or "(defaults)"),
             database=redact_dsn(self.config.database.dsn), pid=os.getpid())
        try:
            with database_dsn(self.config) as dsn:
                self.dsn = dsn
                if not self.wait_for_database():
                    emit("supervisor_stopped", reason="stopped while waiting for the database")
                    return EXIT_OK
                if self.demo:
                    from .demo import submit_demo_tasks
                    submit_demo_tasks(self.db())
                self.start_services()
                try:
                    self.loop()
                finally:
                    self.stop_services()
                    self._close_db()
        except OperationalError as exc:
            emit("supervisor_failed", logging.ERROR, error=str(exc))
            systemd.notify("STOPPING=1", f"STATUS=failed: {exc}")
            return EXIT_FAILURE
        finally:
            self.cleanup_metrics_dir()
        emit("supervisor_stopped")
        return EXIT_OK

    def prepare_metrics_dir(self) -> None:
        """A fresh multiprocess directory, named in the environment before prometheus_client
        is first imported: the library chooses its storage at import time."""
        runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
        if runtime:
            self.metrics_dir = os.path.join(runtime, "metrics")
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            os.makedirs(self.metrics_dir, mode=0o700)
        else:
            self.metrics_dir = tempfile.mkdtemp(prefix="pgtaskd-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
        if "prometheus_client" in sys.modules:
            emit("metrics_degraded", logging.WARNING,
                 reason="prometheus_client was imported before the multiprocess directory was set")

    def cleanup_metrics_dir(self) -> None:
        if self.metrics_dir:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def wait_for_database(self) -> bool:
        """Reach PostgreSQL and migrate, retrying for a while: the database may be starting
        alongside us (same boot, same systemd transaction). False if told to stop first."""
        deadline = time.monotonic() + STARTUP_DB_PATIENCE
        delay = 0.5
        while True:
            try:
                conn = self.db()
                if self.migrate_on_start:
                    for migration in migrate(conn):
                        emit("migration_applied", version=migration.version, name=migration.name)
                return True
            except MigrationError:
                raise
            except (OperationalError, psycopg.OperationalError) as exc:
                self._close_db()
                if any(s in self.signal_queue for s in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)):
                    return False
                if time.monotonic() >= deadline:
                    raise OperationalError(str(exc)) from None
                emit("database_waiting", logging.WARNING, error=str(exc).strip().splitlines()[-1])
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def start_services(self) -> None:
        from .maintenance.health import HealthChecker
        from .maintenance.reaper import LeaseReaper

        config = self.config
        reaper = LeaseReaper(self.dsn, interval=config.reaper.interval,
                             batch_size=config.reaper.batch_size, retry=config.retry,
                             connect_timeout=config.database.connect_timeout,
                             on_reaped=self._count_reaped)
        health = HealthChecker(self.dsn, interval=config.health.interval,
                               max_pending_age=config.health.max_pending_age,
                               lease_grace=max(3 * config.reaper.interval, 10.0),
                               children=lambda: self.children_snapshot,
                               connect_timeout=config.database.connect_timeout)
        self.services = [reaper, health]
        for service in self.services:
            service.start()
        self.health = health
        address = config.metrics.address
        if address:
            from .maintenance.http import MetricsServer
            try:
                self.http = MetricsServer(address, health, self.metrics_dir)
            except OSError as exc:
                raise OperationalError(f"metrics.listen {config.metrics.listen}: cannot listen: "
                                       f"{exc.strerror}") from None
            self.http.start()

    def stop_services(self) -> None:
        if self.http:
            self.http.stop()
        for service in self.services:
            service.stop()

    # -- the loop ---------------------------------------------------------------------------

    def loop(self) -> None:
        self.started_at = time.monotonic()
        self.spawn_generation(self.generation, self.config)
        while True:
            self.wait_for_events()
            self.dispatch_signals()
            self.reap_children()
            self.retry_rescues()
            if self.stopping:
                if self.advance_stop():
                    return
            else:
                self.advance_reload()
                self.manage_workers()
                self.murder_stuck()
            self.notify_systemd()

    def next_deadline(self) -> float:
        """Seconds until the loop has something timed to do: a slot's restart, a stopping
        child's SIGKILL, a rescue retry. Never longer than LOOP_TICK."""
        now = time.monotonic()
        due = [now + LOOP_TICK]
        due += [slot.next_start for slot in self.slots.values() if slot.next_start > now]
        due += [c.kill_at for c in self.children.values() if c.kill_at and not c.killed_by_us]
        if self.pending_rescues:
            due.append(self.next_rescue_at)
        return max(0.0, min(due) - now)

    def wait_for_events(self) -> None:
        fds = [self._wake_r] + [c.read_fd for c in self.children.values() if c.read_fd >= 0]
        try:
            readable, _, _ = select.select(fds, [], [], self.next_deadline())
        except InterruptedError:
            return
        for fd in readable:
            if fd == self._wake_r:
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass
                continue
            child = next((c for c in self.children.values() if c.read_fd == fd), None)
            if child is not None:
                self.read_pipe(child)

    def read_pipe(self, child: Child) -> None:
        try:
            data = os.read(child.read_fd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            os.close(child.read_fd)
            child.read_fd = -1
            return
        for message in child.reader.feed(data):
            self.on_message(child, message)

    def on_message(self, child: Child, message: dict) -> None:
        kind = message.get("kind")
        if kind == "booted":
            child.booted = True
            child.worker_id = message.get("worker_id")
            emit("worker_booted", pool=child.pool, slot=child.slot, child_pid=child.pid,
                 generation=child.generation, worker_id=child.worker_id)
        elif kind == "claimed":
            child.claim = {"task_id": message["task_id"], "token": message["token"],
                           "task_type": message.get("task_type")}
        elif kind == "done":
            child.claim = None
        elif kind == "boot_failed":
            child.boot_error = message.get("error")
        elif kind == "waiting_db":
            child.waiting_db = True

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
        """Make the loop's select() return now. Safe inside a signal handler."""
        try:
            os.write(self._wake_w, b"!")
        except (BlockingIOError, OSError):
            pass

    def dispatch_signals(self) -> None:
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

    def child_command(self, pool: str, slot: int, write_fd: int) -> list[str]:
        command = [sys.executable, "-m", "supervisor.worker.main", "--pool", pool,
                   "--slot", str(slot), "--channel-fd", str(write_fd),
                   "--supervisor-pid", str(os.getpid())]
        if self.config.path:
            command += ["-c", str(self.config.path)]
        return command

    def child_env(self, config: Config) -> dict[str, str]:
        env = systemd.child_environment(dict(os.environ))
        env[DSN_ENV] = self.dsn
        env["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
        # The config text this generation was loaded from: a child restarted after the file
        # was edited (or broken) without a reload must not pick up the file as it is now.
        env.pop(CONFIG_SNAPSHOT_ENV, None)
        if config.source is not None:
            env[CONFIG_SNAPSHOT_ENV] = config.source
        return env

    def generation_config(self, generation: int) -> Config:
        if self.reload is not None and generation == self.reload.generation:
            return self.reload.config
        return self.config

    def spawn_worker(self, pool: str, slot: int, generation: int) -> Child | None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        try:
            process = subprocess.Popen(
                self.child_command(pool, slot, write_fd), pass_fds=(write_fd,),
                env=self.child_env(self.generation_config(generation)),
                stdin=subprocess.DEVNULL, close_fds=True,
                # A process group per child: killing a child kills what its handler started
                # too, so no orphaned subprocess keeps working on a task that runs again.
                start_new_session=True)
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            emit("worker_spawn_failed", logging.ERROR, pool=pool, slot=slot, error=str(exc))
            return None
        os.close(write_fd)
        child = Child(process, pool, slot, generation, read_fd)
        self.children[process.pid] = child
        emit("worker_spawned", pool=pool, slot=slot, child_pid=process.pid, generation=generation)
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
            state = self.pool_states[pool.name]
            live = self.live_children(pool.name)
            target = self.targets.get(pool.name, pool.processes)
            if len(live) > target:
                # Shrink by stopping the oldest first: the youngest have the freshest state.
                for child in sorted(live, key=lambda c: c.started)[:len(live) - target]:
                    self.stop_child(child, "shrink")
                continue
            if state.fused or len(live) >= target:
                continue
            used = {c.slot for c in live}
            for slot in range(1, target + 1):
                if len(used) >= target:
                    break
                if slot in used:
                    continue
                if self.slots[(pool.name, slot)].next_start > now:
                    continue
                if self.spawn_worker(pool.name, slot, self.generation):
                    used.add(slot)

    def stop_child(self, child: Child, reason: str, *, grace: float | None = None) -> None:
        """Ask a child to finish its current task and exit; SIGKILL it after ``grace``."""
        if child.stopping:
            return
        child.stopping = reason
        grace = self.config.shutdown_timeout if grace is None else grace
        child.kill_at = time.monotonic() + grace
        self._signal(child, signal.SIGTERM)

    def kill_child(self, child: Child) -> None:
        child.killed_by_us = True
        self._kill_group(child)

    def _kill_group(self, child: Child) -> None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _signal(self, child: Child, signum: int) -> None:
        try:
            child.process.send_signal(signum)
        except ProcessLookupError:
            pass

    def murder_stuck(self) -> None:
        """SIGKILL children past their stop grace, and children that never booted."""
        now = time.monotonic()
        for child in list(self.children.values()):
            if child.kill_at is not None and now >= child.kill_at and not child.killed_by_us:
                emit("worker_stop_timeout", logging.WARNING, pool=child.pool, slot=child.slot,
                     child_pid=child.pid, task_id=(child.claim or {}).get("task_id"))
                self.kill_child(child)
            elif not child.booted and not child.stopping and not child.waiting_db \
                    and now - child.started > BOOT_TIMEOUT:
                child.boot_error = f"did not boot within {BOOT_TIMEOUT:g} s"
                self.kill_child(child)

    def reap_children(self) -> None:
        """Collect every exited child: log how it ended, settle its claim, plan its restart.

        Each child is polled by its own pid, not waitpid(-1): the supervisor runs other
        subprocesses (pg_ctl, the handler import probe) whose statuses are not ours to take.
        """
        for child in list(self.children.values()):
            code = child.process.poll()
            if code is None:
                continue
            # Whatever the child wrote before it died (a last "done") must count.
            while child.read_fd >= 0:
                self.read_pipe(child)
                if child.read_fd >= 0 and not select.select([child.read_fd], [], [], 0)[0]:
                    os.close(child.read_fd)
                    child.read_fd = -1
            del self.children[child.pid]
            self.on_child_exit(child, code)

    def on_child_exit(self, child: Child, code: int) -> None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(child.pid, self.metrics_dir)
        lived = time.monotonic() - child.started
        how = describe_exit(code, sent_by_us=child.killed_by_us)
        expected = child.stopping is not None and code == 0
        level = logging.INFO if expected else logging.ERROR
        emit("worker_exited", level, pool=child.pool, slot=child.slot, child_pid=child.pid,
             exit=how, lived_seconds=round(lived, 3), booted=child.booted,
             stopping=child.stopping, task_id=(child.claim or {}).get("task_id"))
        if child.claim:
            # Whatever the handler started must be gone before the task can run again.
            self._kill_group(child)
            self.settle_claim(child, how)
        if child.stopping:
            return
        if child.generation != self.generation:
            # A child of a reload in progress: the reload fails as a whole, nothing restarts.
            if self.reload is not None and child.generation == self.reload.generation:
                when = "during the reload" if child.booted else "before booting"
                self.reload.failure = (f"new worker {child.label()} exited {when} "
                                       f"({how}): {child.boot_error or 'see its log'}")
            return
        self.plan_restart(child, how, lived)

    def settle_claim(self, child: Child, how: str) -> None:
        """The task a dead child held: released without spending a retry if we stopped it,
        else counted as a failed attempt at once (no waiting for the lease to expire)."""
        if child.stopping and child.killed_by_us:
            reason = "release"
        else:
            reason = f"worker {child.worker_id or child.label()} died ({how}) while running the task"
        self.pending_rescues.append((child, reason))
        self.retry_rescues()

    def retry_rescues(self) -> None:
        if not self.pending_rescues or time.monotonic() < self.next_rescue_at:
            return
        still = []
        for child, reason in self.pending_rescues:
            try:
                self.rescue(child, reason)
            except (psycopg.Error, OperationalError) as exc:
                self._close_db()
                # The lease will expire and the reaper will settle it if we never can.
                # The first line is the error itself (a lock timeout, say); later ones are
                # context.
                emit("rescue_deferred", logging.WARNING, task_id=child.claim["task_id"],
                     error=str(exc).strip().splitlines()[0])
                still.append((child, reason))
        self.pending_rescues = still
        self.rescue_failures = self.rescue_failures + 1 if still else 0
        # Each attempt may block for connect_timeout; do not let an outage stall the loop.
        self.next_rescue_at = time.monotonic() + (min(2 ** self.rescue_failures, 30) if still else 0)

    def rescue(self, child: Child, reason: str) -> None:
        from . import metrics

        claim = child.claim
        task_type = claim.get("task_type") or ""
        if reason == "release":
            released = store.release_task(self.db(), claim["task_id"], claim["token"])
            emit("task_released", task_id=claim["task_id"], task_type=task_type,
                 released=released, pool=child.pool)
            return
        row = store.rescue_task(self.db(), claim["task_id"], claim["token"], error=reason,
                                retry=self.config.retry)
        if row is None:
            emit("rescue_skipped", task_id=claim["task_id"], task_type=task_type,
                 reason="the claim was already settled or lost")
            return
        metrics.TASKS_RESCUED.labels(child.pool, task_type).inc()
        if row["status"] == "FAILED":
            metrics.TASKS_FAILED.labels(child.pool, task_type).inc()
            emit("task_failed", logging.ERROR, task_id=row["id"], task_type=task_type,
                 retry_count=row["retry_count"], error=reason, rescued=True, pool=child.pool)
        else:
            metrics.TASKS_RETRIED.labels(child.pool, task_type).inc()
            emit("task_retry_scheduled", logging.WARNING, task_id=row["id"], task_type=task_type,
                 retry_count=row["retry_count"], retry_delay=round(row["retry_delay"], 3),
                 error=reason, rescued=True, pool=child.pool)

    def plan_restart(self, child: Child, how: str, lived: float) -> None:
        from . import metrics

        now = time.monotonic()
        slot = self.slots[(child.pool, child.slot)]
        slot.failures = 1 if lived >= STABLE_AFTER else slot.failures + 1
        delay = min(RESTART_BASE_DELAY * 2 ** (slot.failures - 1), RESTART_MAX_DELAY)
        slot.next_start = now + delay * (1 + random.random() * 0.25)
        metrics.WORKER_RESTARTS.labels(child.pool).inc()
        if child.booted:
            return
        # It never booted: a broken handler import, a bad config. Count toward the fuse.
        state = self.pool_states[child.pool]
        state.boot_failures.append(now)
        state.last_error = child.boot_error or how
        while state.boot_failures and now - state.boot_failures[0] > FUSE_WINDOW:
            state.boot_failures.popleft()
        if len(state.boot_failures) >= FUSE_FAILURES and not state.fused:
            state.fused = True
            emit("pool_fused", logging.CRITICAL, pool=child.pool,
                 error=f"{len(state.boot_failures)} workers failed to boot within "
                       f"{FUSE_WINDOW:g} s; restarts stopped until a reload (SIGHUP). "
                       f"Last: {state.last_error}")

    # -- reload -----------------------------------------------------------------------------

    def begin_reload(self) -> None:
        try:
            new_config = load_config(self.config.path)
        except ConfigError as exc:
            emit("reload_failed", logging.ERROR, reason="invalid config, keeping the running one",
                 problems=exc.problems)
            return
        if new_config.database.dsn != self.config.database.dsn or \
                new_config.database.data_dir != self.config.database.data_dir:
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
                self.stop_child(child, "reload aborted")
            emit("reload_failed", logging.ERROR, generation=reload.generation,
                 reason=failed or "the new workers did not boot in time",
                 kept_generation=self.generation)
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
        self.generation = reload.generation
        self.targets = {p.name: p.processes for p in reload.config.pools}
        self.pool_states.clear()  # a reload is the way to re-arm a fused pool
        self.slots.clear()
        self.reload = None
        emit("reload_finished", generation=self.generation, pools=dict(self.targets))
        systemd.notify("READY=1")

    # -- stopping ---------------------------------------------------------------------------

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
                self.stop_child(child, "shutdown", grace=grace)

    def advance_stop(self) -> bool:
        """Drive the shutdown; True once every child is gone and every claim settled."""
        self.murder_stuck()
        if self.children:
            return False
        if self.pending_rescues:
            # The database is away: the leases will expire and another daemon's reaper (or
            # ours, next start) settles these; do not hang the shutdown on it.
            emit("shutdown_unsettled", logging.WARNING,
                 tasks=[c.claim["task_id"] for c, _ in self.pending_rescues])
        return True

    # -- status -----------------------------------------------------------------------------

    def children_status(self):
        from .maintenance.health import ChildrenStatus

        live = sum(1 for c in self.children.values()
                   if c.generation == self.generation and c.booted and not c.stopping)
        expected = sum(self.targets.values())
        fused = tuple(sorted(name for name, s in self.pool_states.items() if s.fused))
        return ChildrenStatus(live, expected, fused)

    def notify_systemd(self) -> None:
        now = time.monotonic()
        status = self.children_status()
        # The health thread reads this reference; replacing it whole is atomic.
        self.children_snapshot = status
        if not self.ready_sent and not self.stopping:
            first = [c for c in self.children.values() if c.generation == 1]
            all_booted = all(c.booted for c in first) and len(first) >= status.expected
            if all_booted or status.fused_pools or now - self.started_at > BOOT_TIMEOUT:
                self.ready_sent = True
                systemd.notify("READY=1")
                emit("supervisor_ready", live=status.live, expected=status.expected,
                     fused_pools=list(status.fused_pools))
        interval = systemd.watchdog_interval()
        if interval and now - self._last_watchdog >= interval:
            self._last_watchdog = now
            systemd.notify("WATCHDOG=1")
        line = f"STATUS={status.live}/{status.expected} workers"
        busy = sum(1 for c in self.children.values() if c.claim)
        line += f", {busy} busy"
        if status.fused_pools:
            line += f", FUSED: {','.join(status.fused_pools)}"
        if self.health is not None:
            latest = self.health.latest()
            line += f", {latest.tasks_by_status.get('PENDING', 0)} pending"
        if line != self._last_status:
            self._last_status = line
            systemd.notify(line)

    def _count_reaped(self, row: dict) -> None:
        from . import metrics

        metrics.LEASES_REAPED.labels(row["task_type"], row["status"]).inc()
        counter = metrics.TASKS_FAILED if row["status"] == "FAILED" else metrics.TASKS_RETRIED
        counter.labels("reaper", row["task_type"]).inc()

    # -- the supervisor's own connection (main thread only) ----------------------------------

    def db(self) -> psycopg.Connection:
        if self._db is None:
            self._db = LazyConnection(self.dsn, connect_timeout=self.config.database.connect_timeout,
                                      application_name="pgtaskd supervisor")
        return self._db.get()

    def _close_db(self) -> None:
        if self._db is not None:
            self._db.close()


def describe_exit(code: int, *, sent_by_us: bool = False) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if sent_by_us:
        return f"{name} (sent by the supervisor)"
    if -code == signal.SIGKILL:
        return f"{name} (possibly the OOM killer)"
    return name
