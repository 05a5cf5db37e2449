"""The supervisor's start-up and its background services.

Everything the supervisor does with the database runs here, on threads of its own: the
lease keeper, the reaper, the health check, retention, the scheduler, the registry, the
minute rollup (for the web console), the wake-up listener; plus the metrics archive and the
HTTP endpoint. The arbiter's main loop only hands them work and reads
what they report, so it never waits on the database. ``wait_for_database`` runs once,
before the loop and before any child exists.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from typing import Callable, Sequence

import psycopg

from ..config import Config
from ..db.connect import LazyConnection
from ..db.migrate import migrate, refuse_newer_schema
from ..errors import MigrationError, OperationalError, one_line
from ..logs import emit

# Database start-up: how long the supervisor waits for PostgreSQL before giving up.
STARTUP_DB_PATIENCE = 60.0


def prepare_metrics_dir() -> str:
    """A fresh multiprocess directory, named in the environment before prometheus_client is
    first imported: the library chooses its storage at import time."""
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if runtime:
        metrics_dir = os.path.join(runtime, "metrics")
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.makedirs(metrics_dir, mode=0o700)
    else:
        metrics_dir = tempfile.mkdtemp(prefix="pgtaskd-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    if "prometheus_client" in sys.modules:
        emit("metrics_degraded", logging.WARNING,
             reason="prometheus_client was imported before the multiprocess directory was set")
    return metrics_dir


def cleanup_metrics_dir(metrics_dir: str | None) -> None:
    if metrics_dir:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def wait_for_database(config: Config, dsn: str, *, migrate_on_start: bool, demo: bool,
                      stop_asked: Callable[[], bool]) -> bool:
    """Reach PostgreSQL and migrate, retrying for a while: the database may be starting
    alongside us (same boot, same systemd transaction). False if told to stop first."""
    deadline = time.monotonic() + STARTUP_DB_PATIENCE
    delay = 0.5
    db = LazyConnection(dsn, connect_timeout=config.database.connect_timeout,
                        application_name="pgtaskd supervisor",
                        pooled=config.database.transaction_pooler)
    try:
        while True:
            try:
                conn = db.get()
                if migrate_on_start:
                    for migration in migrate(conn, pooled=config.database.transaction_pooler):
                        emit("migration_applied", version=migration.version,
                             name=migration.name)
                else:
                    refuse_newer_schema(conn)
                # Before any child claims: a limit must bind this daemon's first claims.
                # Also without limits: a claim this daemon made before its config lost the
                # line is dropped now.
                from ..maintenance.concurrency_limits import write_limits
                write_limits(conn, config.limits, daemon=daemon_identity(config),
                             starting=True)
                if demo:
                    from .demo import submit_demo_tasks
                    submit_demo_tasks(conn)
                return True
            except MigrationError:
                raise
            except (OperationalError, psycopg.OperationalError) as exc:
                db.close()
                if stop_asked():
                    return False
                if time.monotonic() >= deadline:
                    raise OperationalError(str(exc)) from None
                emit("database_waiting", logging.WARNING,
                     error=one_line(exc))
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
    finally:
        db.close()


def daemon_identity(config: Config) -> str:
    """Who this daemon is in the rows daemons share (a schedule's reports, a limit's claims):
    its host and config file, so that a reload and a restart are the same daemon, and a
    daemon started again without a limit line drops the claim it had made. Without a file
    (a config built in code) the process is the daemon."""
    where = str(config.path.resolve()) if config.path else f"pid {os.getpid()}"
    return f"{socket.gethostname()}:{where}"


class Services:
    """The supervisor's threads, started and stopped together."""

    def __init__(self, config: Config, dsn: str, metrics_dir: str, *,
                 children: Callable[[], Sequence], children_status: Callable,
                 snapshot: Callable,
                 loop_age: Callable[[], float] = lambda: 0.0,
                 reload_facts: Callable[[], tuple] = lambda: (1, None),
                 on_cancelled: Callable[[str], None] = lambda task_id: None,
                 on_newer_schema: Callable[[str], None] = lambda reason: None):
        self.config = config
        self.dsn = dsn
        self.metrics_dir = metrics_dir
        self.children = children
        self.children_status = children_status
        self.loop_age = loop_age
        self.reload_facts = reload_facts
        self.snapshot = snapshot
        self.on_cancelled = on_cancelled
        self.on_newer_schema = on_newer_schema
        self.keeper = None
        self.relay = None
        self.retention = None
        self.scheduler = None
        self.limit_writer = None
        self.registry = None
        self.health = None
        self.metrics_archive = None
        self.http = None
        self._threads: list = []

    def start(self) -> None:
        # Imported here: prometheus_client (through leases and the maintenance services) must
        # not be imported before prepare_metrics_dir() named its directory.
        from ..lease_keeper import LeaseKeeper
        from ..maintenance.health import HealthChecker
        from ..maintenance.concurrency_limits import LimitWriter
        from ..maintenance.metrics_archive import MetricsArchive
        from ..maintenance.reaper import LeaseReaper
        from ..maintenance.registry import DaemonIdentity, DaemonRegistry

        start_counters(self.config)
        from ..maintenance.retention import RetentionService
        from ..maintenance.rollup import MinuteRollup
        from ..maintenance.scheduler import Scheduler
        from .wakeups import WakeRelay

        config, dsn = self.config, self.dsn
        timeout = config.database.connect_timeout
        pooled = config.database.transaction_pooler
        self.keeper = LeaseKeeper(dsn, renew_interval=config.lease.renew_interval,
                                  retry=config.retry, connect_timeout=timeout, pooled=pooled,
                                  on_cancelled=self.on_cancelled)
        reaper = LeaseReaper(dsn, interval=config.reaper.interval,
                             batch_size=config.reaper.batch_size, retry=config.retry,
                             connect_timeout=timeout, on_reaped=count_reaped, pooled=pooled)
        self.health = HealthChecker(dsn, interval=config.health.interval,
                                    max_pending_age=config.health.max_pending_age,
                                    lease_grace=max(3 * config.reaper.interval, 10.0),
                                    children=self.children_status,
                                    task_types=claimed_types(config),
                                    known_types=known_types(config),
                                    connect_timeout=timeout, pooled=pooled,
                                    on_newer_schema=self.on_newer_schema)
        self.retention = RetentionService(dsn, policy=config.retention, connect_timeout=timeout,
                                          on_deleted=count_deleted, pooled=pooled)
        self.scheduler = Scheduler(dsn, schedules=config.schedules,
                                   handled_types=config.handled_types,
                                   max_payload_bytes=config.max_payload_bytes,
                                   connect_timeout=timeout, pooled=pooled,
                                   on_enqueued=count_scheduled,
                                   daemon=daemon_identity(config))
        self.limit_writer = LimitWriter(dsn, limits=config.limits,
                                        daemon=daemon_identity(config),
                                        connect_timeout=timeout, pooled=pooled)
        self.registry = DaemonRegistry(
            dsn, interval=config.registry.interval, snapshot=self.snapshot,
            identity=DaemonIdentity.of(config, daemon_identity(config)),
            connect_timeout=timeout, pooled=pooled)
        rollup = MinuteRollup(dsn, connect_timeout=timeout, pooled=pooled)
        self._threads = [self.keeper, reaper, self.health, self.retention, self.scheduler,
                         self.limit_writer, self.registry, rollup]
        listen_dsn = config.database.listen_dsn or (None if pooled else dsn)
        if config.database.listen and listen_dsn:
            self.relay = WakeRelay(listen_dsn, children=self.children, connect_timeout=timeout,
                                   on_cancelled=self.on_cancelled)
            self._threads.append(self.relay)
        elif config.database.listen:
            emit("wakeups_unavailable", logging.WARNING, fallback="polling",
                 error="LISTEN needs a session connection, which a transaction pooler does "
                       "not give: set database.listen_dsn to PostgreSQL itself")
        for thread in self._threads:
            thread.start()
        self.metrics_archive = MetricsArchive(
            self.metrics_dir, live_pids=lambda: [c.pid for c in self.children()])
        self.metrics_archive.start()
        self.start_http()

    def start_http(self) -> None:
        address = self.config.metrics.address
        if not address:
            return
        from ..maintenance.http import MetricsServer
        try:
            self.http = MetricsServer(address, self.health, self.metrics_archive, self.loop_age,
                                      self.reload_facts,
                                      max_connections=self.config.metrics.max_connections,
                                      request_timeout=self.config.metrics.request_timeout)
        except OSError as exc:
            raise OperationalError(f"metrics.listen {self.config.metrics.listen}: cannot "
                                   f"listen: {exc.strerror}") from None
        self.http.start()

    def apply(self, config: Config) -> None:
        """What a reload may change while the services run."""
        self.keeper.renew_interval = config.lease.renew_interval
        self.keeper.retry = config.retry
        self.health.task_types = claimed_types(config)
        self.health.known_types = known_types(config)
        start_counters(config)
        self.retention.policy = config.retention
        self.retention.interval = config.retention.interval
        self.scheduler.apply(config.schedules, config.handled_types, config.max_payload_bytes)
        self.limit_writer.apply(config.limits)
        self.registry.interval = config.registry.interval

    def stop(self) -> None:
        if self.http:
            self.http.stop()
        if self.metrics_archive:
            self.metrics_archive.stop()
        for thread in self._threads:
            thread.stop()


def claimed_types(config: Config) -> frozenset[str]:
    """The task types this daemon's pools claim: the health check's pending age counts
    only theirs."""
    return frozenset(t for pool in config.pools for t in pool.task_types)


def start_counters(config: Config) -> None:
    from .. import metrics

    metrics.start_supervisor_counters([p.name for p in config.pools],
                                      sorted(claimed_types(config)),
                                      [s.name for s in config.schedules])


def known_types(config: Config) -> frozenset[str]:
    """Every task type the daemon's configs name: those its pools claim or it has handlers
    for, those with a global limit, those a schedule enqueues. The per-type gauges give each
    its own series; the table's other types, which any client may write, share one."""
    return (claimed_types(config) | config.handled_types | frozenset(config.limits)
            | frozenset(s.task_type for s in config.schedules))


def count_reaped(row: dict) -> None:
    from .. import metrics

    metrics.LEASES_REAPED.labels(row["task_type"], row["status"]).inc()
    counter = metrics.TASKS_FAILED if row["status"] == "FAILED" else metrics.TASKS_RETRIED
    counter.labels("reaper", row["task_type"]).inc()


def count_deleted(status: str, count: int) -> None:
    from .. import metrics

    metrics.TASKS_DELETED.labels(status).inc(count)


def count_scheduled(schedule: str, count: int) -> None:
    from .. import metrics

    metrics.TASKS_SCHEDULED.labels(schedule).inc(count)
