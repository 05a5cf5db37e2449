"""The config as the rest of pgtaskd sees it: frozen dataclasses, one per section of the file.

Each field's default comes from ``defaults``; building these from YAML, and refusing what is
out of bounds, is the loader's job.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from ..errors import quote
from ..scheduling.cron import Cron
from ..task_fields import DEFAULT_MAX_PAYLOAD_BYTES
from .defaults import (DEFAULT_CATCH_UP, DEFAULT_HEALTH_INTERVAL, DEFAULT_LEASE_SECONDS,
                       DEFAULT_MAX_CATCH_UP, DEFAULT_MAX_PENDING_AGE, DEFAULT_METRICS_LISTEN,
                       DEFAULT_METRICS_MAX_CONNECTIONS, DEFAULT_METRICS_REQUEST_TIMEOUT,
                       DEFAULT_REAPER_INTERVAL, DEFAULT_REGISTRY_INTERVAL,
                       DEFAULT_RENEW_INTERVAL, DEFAULT_RETENTION_BATCH_SIZE, DEFAULT_RETENTION_CANCELLED,
                       DEFAULT_RETENTION_COMPLETED, DEFAULT_RETENTION_FAILED,
                       DEFAULT_RETENTION_INTERVAL, DEFAULT_RETRY_BASE_DELAY, DEFAULT_RETRY_JITTER,
                       DEFAULT_RETRY_MAX_DELAY, DEFAULT_SHUTDOWN_TIMEOUT,
                       DEFAULT_WEB_DB_CONNECTIONS, DEFAULT_WEB_LISTEN,
                       DEFAULT_WEB_MAX_CONNECTIONS, DEFAULT_WEB_REFRESH_INTERVAL,
                       DEFAULT_WEB_REQUEST_TIMEOUT, FINISHED_STATUSES)


@dataclass(frozen=True)
class DatabaseConfig:
    dsn: str | None
    """libpq connection string or URI; None means the embedded PostgreSQL in ``data_dir``."""
    data_dir: Path
    """Where the embedded PostgreSQL keeps its files (used only without a DSN)."""
    connect_timeout: float = 5.0
    """Seconds to wait for a connection before calling the database unreachable."""
    listen: bool = True
    """Wake idle workers with LISTEN/NOTIFY (one connection per daemon); polling remains the
    fallback. Off, workers only poll."""
    listen_dsn: str | None = None
    """Where the LISTEN connection goes, if not ``dsn``: LISTEN needs a session connection,
    so behind PgBouncer in transaction mode point it at PostgreSQL directly."""
    transaction_pooler: bool = False
    """``dsn`` goes through a pooler in transaction mode (PgBouncer pool_mode=transaction):
    no prepared statements and no session settings; LISTEN only through ``listen_dsn``."""


@dataclass(frozen=True)
class LeaseConfig:
    seconds: float = DEFAULT_LEASE_SECONDS
    """How long a claim is valid without renewal."""
    renew_interval: float = DEFAULT_RENEW_INTERVAL
    """How often the running worker extends its lease; must be well below ``seconds``."""


@dataclass(frozen=True)
class RetryConfig:
    base_delay: float = DEFAULT_RETRY_BASE_DELAY
    """Delay before the first retry; doubles with each further retry."""
    max_delay: float = DEFAULT_RETRY_MAX_DELAY
    """Cap on the doubled delay."""
    jitter: float = DEFAULT_RETRY_JITTER
    """Up to this fraction of the delay is added at random, so failures do not retry in step."""


@dataclass(frozen=True)
class RunPolicy:
    """How the supervisor may stop a run of one task type."""
    timeout: float | None = None
    """Seconds a run may take; past them the supervisor stops it and the run counts as a
    failed attempt ("timed out after N s"). None: no limit."""
    cancel: str = "cooperative"
    """``cooperative``: a cancelled running task's handler learns it from is_cancelled();
    ``kill``: the supervisor also kills the child running it (and what it started)."""

    @property
    def watched(self) -> bool:
        """The supervisor needs to know when each run of this type starts."""
        return self.timeout is not None or self.cancel == "kill"


DEFAULT_POLICY = RunPolicy()


@dataclass(frozen=True)
class HandlersConfig:
    path: Path
    """Folder that worker children put on their import path."""
    types: Mapping[str, str]
    """Task type -> ``module:function`` resolved from ``path``."""
    policies: Mapping[str, RunPolicy] = field(default_factory=dict)
    """Task type -> its RunPolicy, for the types that set ``timeout`` or ``cancel``."""

    def policy(self, task_type: str) -> RunPolicy:
        return self.policies.get(task_type, DEFAULT_POLICY)


@dataclass(frozen=True)
class PoolConfig:
    name: str
    processes: int
    """How many worker children this pool runs."""
    task_types: tuple[str, ...]
    """The task types this pool claims (default: every handled type)."""
    batch_size: int = 1
    """How many due tasks a child claims in one statement and runs in order (1: the seed's
    one at a time)."""
    max_tasks_per_child: int | None = None
    """A child exits after about this many tasks (each child draws its own number within
    10% of it, so they do not all recycle at once) and is replaced; None: never."""
    max_memory_mb: float | None = None
    """A child whose resident memory is above this after a task exits and is replaced."""
    concurrency: int = 1
    """How many claims a child runs at once: plain handlers on that many threads, async ones
    on one event loop (1: one task at a time, as the seed's loop)."""

    @property
    def board_slots(self) -> int:
        """Claims a child may hold at once, each with a slot on its claim board: a concurrent
        child's running tasks, and as many finished ones whose completion is not written."""
        return self.batch_size if self.concurrency == 1 else 2 * self.concurrency


@dataclass(frozen=True)
class ReaperConfig:
    interval: float = DEFAULT_REAPER_INTERVAL
    """Seconds between scans for expired leases."""
    batch_size: int = 100
    """At most this many expired tasks are rescued per statement."""


@dataclass(frozen=True)
class HealthConfig:
    interval: float = DEFAULT_HEALTH_INTERVAL
    """Seconds between health checks."""
    max_pending_age: float = DEFAULT_MAX_PENDING_AGE
    """A due task waiting longer than this makes the daemon unhealthy."""


@dataclass(frozen=True)
class RegistryConfig:
    interval: float = DEFAULT_REGISTRY_INTERVAL
    """Seconds between the daemon's heartbeats in the registry (``pgtaskd daemons``); a
    daemon silent for three of them (at least 10 s) shows as lost."""


@dataclass(frozen=True)
class RetentionConfig:
    """How long finished tasks stay in the table. A retention of None (``false`` in the
    YAML) keeps the tasks of that status forever; ``null`` or an absent key means the
    default, and 0 is refused, so that no spelling of "keep" can delete everything."""

    completed: float | None = DEFAULT_RETENTION_COMPLETED
    """Seconds a COMPLETED task is kept after it finished; None keeps it forever."""
    failed: float | None = DEFAULT_RETENTION_FAILED
    """Seconds a FAILED task is kept after it finished; None keeps it forever."""
    cancelled: float | None = DEFAULT_RETENTION_CANCELLED
    """Seconds a CANCELLED task is kept after it finished; None keeps it forever."""
    interval: float = DEFAULT_RETENTION_INTERVAL
    """Seconds between retention passes."""
    batch_size: int = DEFAULT_RETENTION_BATCH_SIZE
    """At most this many tasks are deleted per statement, each in its own short transaction."""

    def periods(self) -> dict[str, float]:
        """Status -> retention in seconds, for each status whose tasks are ever deleted."""
        chosen = {"COMPLETED": self.completed, "FAILED": self.failed,
                  "CANCELLED": self.cancelled}
        return {status: chosen[status] for status in FINISHED_STATUSES
                if chosen[status] is not None}


@dataclass(frozen=True)
class LoggingConfig:
    format: str = "auto"
    """``json``, ``text``, or ``auto``: text when stderr is a terminal, JSON otherwise (under
    systemd). ``PGTASKD_LOG_FORMAT`` wins over it."""
    level: str = "info"
    """``debug``, ``info``, ``warning`` or ``error``. ``PGTASKD_LOG_LEVEL`` wins over it."""


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = DEFAULT_METRICS_LISTEN
    """``host:port`` of the /metrics and /healthz endpoint; empty string disables it."""
    max_connections: int = DEFAULT_METRICS_MAX_CONNECTIONS
    """Connections open at once; past it, a new one replaces the oldest that has not sent its
    request for a second, or is closed. Each costs the supervisor a file descriptor."""
    request_timeout: float = DEFAULT_METRICS_REQUEST_TIMEOUT
    """Seconds a client has to send its whole request, and again to read the answer; a
    slower or idle client is disconnected."""

    @property
    def address(self) -> tuple[str, int] | None:
        if not self.listen:
            return None
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def exposed(self) -> bool:
        """The endpoint listens on an address other hosts may reach (not loopback)."""
        address = self.address
        return address is not None and not ipaddress.ip_address(address[0]).is_loopback


@dataclass(frozen=True)
class WebAuthConfig:
    users: Mapping[str, str] = field(default_factory=dict)
    """User name -> password hash (``pgtaskd web hash-password``): who may log in."""
    proxy_header: str | None = None
    """A header that a reverse proxy in front of the console sets to the user it
    authenticated (like ``X-Forwarded-User``); believed only from ``trusted_proxies``."""
    trusted_proxies: tuple[str, ...] = ("127.0.0.1", "::1")
    """The addresses whose ``proxy_header`` is believed: the proxy's own."""

    @property
    def enabled(self) -> bool:
        return bool(self.users) or self.proxy_header is not None


@dataclass(frozen=True)
class WebConfig:
    """``pgtaskd web``: the console, a process of its own."""

    listen: str = DEFAULT_WEB_LISTEN
    """``address:port`` it serves on; beyond loopback only with ``auth``."""
    actions: bool = False
    """Whether an authenticated user may act (retry, cancel, pause, resume, limits); off,
    the console only shows."""
    auth: WebAuthConfig = field(default_factory=WebAuthConfig)
    max_connections: int = DEFAULT_WEB_MAX_CONNECTIONS
    """Connections open at once; past it a new one takes the place of the oldest that has
    not sent its request for a second, or is closed."""
    request_timeout: float = DEFAULT_WEB_REQUEST_TIMEOUT
    """Seconds a client has to send a request's head (and an idle kept-alive connection
    waits for its next one) and, again, to take the answer."""
    refresh_interval: float = DEFAULT_WEB_REFRESH_INTERVAL
    """Seconds between a page's live updates."""
    db_connections: int = DEFAULT_WEB_DB_CONNECTIONS
    """Database connections the console holds at most (pages wait for one)."""

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)

    @property
    def exposed(self) -> bool:
        return not ipaddress.ip_address(self.address[0]).is_loopback


@dataclass(frozen=True)
class ScheduleConfig:
    """A periodic task: one task of ``task_type`` for each instant ``cron`` names, whose id is
    ``schedule:<name>:<the instant in UTC>``, so that every daemon may enqueue it and it
    exists once."""

    name: str
    """Names the schedule's tasks and its state in the database; also the tasks' ``name``."""
    cron: Cron
    """When: a cron expression on the wall clock of its time zone (UTC unless given)."""
    task_type: str
    """The type of every task enqueued. A daemon with another config may be the one to run it."""
    payload: Mapping[str, Any] = field(default_factory=dict)
    """Every task's payload, as written."""
    priority: int = 0
    max_retries: int = 3
    catch_up: str = DEFAULT_CATCH_UP
    """Instants that came due while no daemon enqueued them (all were down): ``all`` enqueues
    them (the newest ``max_catch_up``), ``latest`` only the most recent one, ``skip`` none."""
    max_catch_up: int = DEFAULT_MAX_CATCH_UP
    """The most instants ``catch_up: all`` enqueues after an outage (the most recent ones)."""

    def task_id(self, instant: datetime) -> str:
        return schedule_task_id(self.name, instant)


def schedule_task_id(name: str, instant: datetime) -> str:
    """``schedule:<name>:<instant>``, the instant in UTC to the second (cron has no finer
    resolution): the same text on every host, so each instant is one task however many
    daemons enqueue it."""
    return f"schedule:{name}:{instant.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%SZ}"


@dataclass(frozen=True)
class Config:
    path: Path | None
    database: DatabaseConfig
    lease: LeaseConfig
    poll_interval: float
    retry: RetryConfig
    handlers: HandlersConfig
    pools: tuple[PoolConfig, ...]
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
    reload_timeout: float | None = None
    """How long a reload or a shrink lets an old child finish its task before killing it
    (the run then counts as a failed attempt); None: as long as the task takes."""
    reaper: ReaperConfig = field(default_factory=ReaperConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    schedules: tuple[ScheduleConfig, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)
    """Global concurrency limits (task type -> most RUNNING at once across every daemon),
    written to the database at start and on each reload."""
    web: WebConfig = field(default_factory=WebConfig)
    source: str | None = field(default=None, compare=False, repr=False)
    """The text of the config file this was parsed from (None for built-in defaults)."""

    @property
    def handled_types(self) -> frozenset[str]:
        return frozenset(self.handlers.types)

    def warnings(self) -> list[str]:
        """What deserves a look but does not stop this config from loading (check-config
        prints it). As for ``pgtaskd submit``, only a config that names handlers can say a
        type has none: a config without any only enqueues."""
        found = []
        if self.metrics.exposed:
            found.append(f"metrics.listen: {self.metrics.listen} is not a loopback address: "
                         f"/metrics and /healthz have no authentication, so anyone who can "
                         f"reach it reads the queue's state")
        if self.web.exposed and not self.web.auth.enabled:
            found.append(f"web.listen: {self.web.listen} is not a loopback address and "
                         f"web.auth sets no users nor proxy_header: 'pgtaskd web' refuses "
                         f"to start so")
        if self.handlers.types:
            found += [f"schedules.{s.name}.task_type: no handler for {quote(s.task_type)} "
                      f"under handlers.types; its tasks wait for a daemon whose config "
                      f"handles it"
                      for s in self.schedules if s.task_type not in self.handlers.types]
        return found
