"""The YAML config: frozen dataclasses, defaults in one place, validation that names key paths.

Every problem found is collected (not just the first) so that ``pgtaskd check-config`` can
print one line per problem. Relative paths are resolved against the config file's folder, so
a config works the same whatever the daemon's working directory is.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from .yaml_file import check_size, parse_yaml, read_config_text
from ..scheduling.cron import Cron, CronError, check_expression, load_zone
from ..db.redact import dsn_problem
from ..errors import ConfigError, UsageError, quote

CONFIG_ENV = "PGTASKD_CONFIG"
DSN_ENV = "PGTASKD_DSN"
# The supervisor hands each worker child the text of the config file as it read it for the
# child's generation, so a child that restarts after the file was edited (or broken) but not
# yet reloaded runs the same configuration as its siblings.
CONFIG_SNAPSHOT_ENV = "PGTASKD_CONFIG_SNAPSHOT"

DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_RENEW_INTERVAL = 10.0
DEFAULT_POLL_INTERVAL = 0.5
DEFAULT_RETRY_BASE_DELAY = 2.0
DEFAULT_RETRY_MAX_DELAY = 600.0
DEFAULT_RETRY_JITTER = 0.1
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
DEFAULT_REAPER_INTERVAL = 5.0
DEFAULT_HEALTH_INTERVAL = 5.0
DEFAULT_MAX_PENDING_AGE = 300.0
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
DEFAULT_METRICS_MAX_CONNECTIONS = 64
DEFAULT_METRICS_REQUEST_TIMEOUT = 5.0
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_DATA_DIR = "var/pgdata"
DEFAULT_HANDLERS_PATH = "handlers"
MAX_BATCH_SIZE = 1000
MAX_TASK_TYPE_LENGTH = 200
# Each unit of a limit is a row that claims of its type may lock; far past any fleet's size.
MAX_LIMIT = 10_000
CANCEL_MODES = ("cooperative", "kill")
DEFAULT_RETENTION_COMPLETED = 7 * 86400.0
DEFAULT_RETENTION_FAILED = 30 * 86400.0
DEFAULT_RETENTION_CANCELLED = 30 * 86400.0
DEFAULT_RETENTION_INTERVAL = 60.0
DEFAULT_RETENTION_BATCH_SIZE = 1000
# Bounds on what a config may ask for. A duration past a week is a typo (1e12 seconds would
# leave a lease held until the year 33715), and a pool of thousands of processes on one host
# is one too.
MAX_SECONDS = 7 * 86400.0
MAX_PROCESSES = 512
MAX_PAYLOAD_LIMIT = 256 * 1024 * 1024
# Retention periods are the one kind of duration measured in weeks or years; ten years is
# past any audit requirement, and longer is what ``false`` (keep forever) is for.
MAX_RETENTION_SECONDS = 10 * 366 * 86400.0
MAX_RETENTION_BATCH_SIZE = 100_000
# The finished statuses retention deletes, in the order a pass visits them.
FINISHED_STATUSES = ("COMPLETED", "FAILED", "CANCELLED")
# Each HTTP connection holds a descriptor in the supervisor, whose limit is often 1024.
MAX_METRICS_CONNECTIONS = 512
# What a schedule does with the instants that came due while no daemon enqueued them.
CATCH_UP_POLICIES = ("all", "latest", "skip")
DEFAULT_CATCH_UP = "latest"
DEFAULT_MAX_CATCH_UP = 100
# A catch-up enqueues its tasks in one statement; past this many, a schedule is a backfill,
# which is a job for submit_many.
MAX_CATCH_UP_LIMIT = 10_000
DEFAULT_SCHEDULE_TIMEZONE = "UTC"
# The range of PostgreSQL's INTEGER, which priority and max_retries are stored as.
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

_HANDLER_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_POOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
# A schedule's name is part of its tasks' ids (schedule:<name>:<instant>): no colon, and short
# enough that every id stays within the client's 200 characters.
_SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


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
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    schedules: tuple[ScheduleConfig, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)
    """Global concurrency limits (task type -> most RUNNING at once across every daemon),
    written to the database at start and on each reload."""
    source: str | None = field(default=None, compare=False, repr=False)
    """The text of the config file this was parsed from (None for built-in defaults)."""

    @property
    def handled_types(self) -> frozenset[str]:
        return frozenset(self.handlers.types)

    def warnings(self) -> list[str]:
        """What deserves a look but does not stop this config from loading (check-config
        prints it). As for ``pgtaskd submit``, only a config that names handlers can say a
        type has none: a config without any only enqueues."""
        if not self.handlers.types:
            return []
        return [f"schedules.{s.name}.task_type: no handler for {quote(s.task_type)} under "
                f"handlers.types; its tasks wait for a daemon whose config handles it"
                for s in self.schedules if s.task_type not in self.handlers.types]


class _Validator:
    """Reads a parsed YAML tree, collecting one problem per bad key path."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.problems: list[str] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def section(self, tree: Mapping, key: str, path: str, allowed: set[str]) -> dict:
        value = tree.get(key, {})
        full = f"{path}.{key}" if path else key
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(full, f"must be a mapping, got {_type_name(value)}")
            return {}
        self.unknown(value, full, allowed)
        return value

    def unknown(self, tree: Mapping, path: str, allowed: set[str]) -> None:
        for key in tree:
            if key not in allowed:
                where = f"{path}.{_key(key)}" if path else _key(key)
                self.problem(where, f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def number(self, tree: Mapping, key: str, path: str, default: float, *,
               minimum: float = 0.0, strict: bool = True,
               maximum: float = MAX_SECONDS, hint: str = "", unit: str = "seconds") -> float:
        """``hint``, if given, ends every problem line about this key."""
        if key not in tree or tree[key] is None:
            return default
        value = tree[key]
        full = f"{path}.{key}" if path else key
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.problem(full, f"must be a number of {unit}{hint}, got {_type_name(value)} "
                               f"{quote(value)}")
            return default
        # An integer is finite, and may be too large for math.isfinite() to convert.
        if isinstance(value, float) and not math.isfinite(value):
            self.problem(full, f"must be a finite number{hint}, got {quote(value)}")
            return default
        if (strict and value <= minimum) or (not strict and value < minimum):
            bound = "greater than" if strict else "at least"
            self.problem(full, f"must be {bound} {minimum:g}{hint}, got {quote(value)}")
            return default
        if value > maximum:
            self.problem(full, f"must be at most {maximum:g}{hint}, got {quote(value)}")
            return default
        return float(value)

    def retention(self, tree: Mapping, key: str, path: str, default: float) -> float | None:
        """A retention period in seconds, or None for ``false``: keep forever."""
        if tree.get(key) is False:
            return None
        return self.number(tree, key, path, default, maximum=MAX_RETENTION_SECONDS,
                           hint=" (or false to keep these tasks forever)")

    def boolean(self, tree: Mapping, key: str, path: str, default: bool) -> bool:
        if key not in tree or tree[key] is None:
            return default
        value = tree[key]
        if not isinstance(value, bool):
            self.problem(f"{path}.{key}" if path else key,
                         f"must be true or false, got {_type_name(value)} {quote(value)}")
            return default
        return value

    def integer(self, tree: Mapping, key: str, path: str, default: int, *, minimum: int,
                maximum: int) -> int:
        if key not in tree or tree[key] is None:
            return default
        value = tree[key]
        full = f"{path}.{key}" if path else key
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(full, f"must be a whole number, got {_type_name(value)} {quote(value)}")
            return default
        if not minimum <= value <= maximum:
            self.problem(full, f"must be from {minimum} to {maximum}, got {quote(value)}")
            return default
        return value

    def string(self, tree: Mapping, key: str, path: str, default: str | None) -> str | None:
        if key not in tree or tree[key] is None:
            return default
        value = tree[key]
        if not isinstance(value, str):
            self.problem(f"{path}.{key}" if path else key,
                         f"must be a string, got {_type_name(value)}")
            return default
        return value

    def directory(self, tree: Mapping, key: str, path: str, default: str) -> Path:
        raw = self.string(tree, key, path, default) or default
        if "\x00" in raw:  # the OS cannot take it, and Path.resolve() raises on it
            self.problem(f"{path}.{key}", "must not hold a NUL character")
            raw = default
        candidate = Path(os.path.expanduser(raw))
        return candidate if candidate.is_absolute() else (self.base_dir / candidate).resolve()

    def dsn(self, where: str, dsn: str | None) -> str | None:
        """The DSN, after recording why libpq could not read it (no part of its password)."""
        problem = dsn_problem(dsn) if dsn else None
        if problem:
            self.problem(where, problem)
        return dsn


def _key(key: Any) -> str:
    """A mapping key as a key path shows it: as written if it is a short string."""
    if isinstance(key, str) and 0 < len(key) <= 60 and key.isprintable():
        return key
    return quote(key)


def _type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean",
            int: "integer", float: "number", type(None): "null"}.get(type(value), type(value).__name__)


_TOP_KEYS = {"database", "lease", "poll_interval", "retry", "handlers", "pools",
             "shutdown_timeout", "reload_timeout", "reaper", "health", "retention",
             "metrics", "max_payload_bytes", "schedules", "limits"}


def parse_config(tree: Any, *, base_dir: Path, path: Path | None = None,
                 env: Mapping[str, str] | None = None, source: str | None = None) -> Config:
    """Build a Config from a parsed YAML tree, or raise ConfigError listing every problem."""
    env = os.environ if env is None else env
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(f"(top level): must be a mapping of keys, got {_type_name(tree)}")
    v = _Validator(base_dir)
    v.unknown(tree, "", _TOP_KEYS)

    database = _parse_database(v, tree, env)

    lease_tree = v.section(tree, "lease", "", {"seconds", "renew_interval"})
    seconds = v.number(lease_tree, "seconds", "lease", DEFAULT_LEASE_SECONDS)
    # Unset, the renewal follows the lease: a third of it (10 s for the default 30 s), so
    # that shortening only lease.seconds never trips the check below.
    lease = LeaseConfig(
        seconds=seconds,
        renew_interval=v.number(lease_tree, "renew_interval", "lease",
                                seconds * DEFAULT_RENEW_INTERVAL / DEFAULT_LEASE_SECONDS),
    )
    if lease.renew_interval >= lease.seconds:
        v.problem("lease.renew_interval",
                  f"must be shorter than lease.seconds ({lease.renew_interval:g} >= {lease.seconds:g}),"
                  " or the lease lapses between renewals")

    retry_tree = v.section(tree, "retry", "", {"base_delay", "max_delay", "jitter"})
    retry = RetryConfig(
        base_delay=v.number(retry_tree, "base_delay", "retry", DEFAULT_RETRY_BASE_DELAY,
                            strict=False),
        max_delay=v.number(retry_tree, "max_delay", "retry", DEFAULT_RETRY_MAX_DELAY, strict=False),
        jitter=v.number(retry_tree, "jitter", "retry", DEFAULT_RETRY_JITTER, strict=False),
    )
    if retry.max_delay < retry.base_delay:
        v.problem("retry.max_delay", f"must be at least retry.base_delay ({retry.base_delay:g})")
    if retry.jitter > 1:
        v.problem("retry.jitter", f"must be a fraction from 0 to 1, got {retry.jitter:g}")

    handlers = _parse_handlers(v, tree)
    pools = _parse_pools(v, tree, handlers)

    reaper_tree = v.section(tree, "reaper", "", {"interval", "batch_size"})
    health_tree = v.section(tree, "health", "", {"interval", "max_pending_age"})
    retention = _parse_retention(v, tree)
    metrics_tree = v.section(tree, "metrics", "", {"listen", "max_connections",
                                                   "request_timeout"})
    listen = v.string(metrics_tree, "listen", "metrics", DEFAULT_METRICS_LISTEN) or ""
    if listen and not re.match(r"^(\[[0-9a-fA-F:]+\]|[^:\s]+):\d{1,5}$", listen):
        v.problem("metrics.listen",
                  f"must be host:port (like 127.0.0.1:9464), got {quote(listen)}")
    elif listen and not 0 <= int(listen.rpartition(":")[2]) <= 65535:
        v.problem("metrics.listen", f"port must be 0 to 65535, got {quote(listen)}")

    max_payload_bytes = v.integer(tree, "max_payload_bytes", "", DEFAULT_MAX_PAYLOAD_BYTES,
                                  minimum=2, maximum=MAX_PAYLOAD_LIMIT)
    schedules = _parse_schedules(v, tree, max_payload_bytes)

    config = Config(
        path=path,
        database=database,
        lease=lease,
        poll_interval=v.number(tree, "poll_interval", "", DEFAULT_POLL_INTERVAL, maximum=3600),
        retry=retry,
        handlers=handlers,
        pools=pools,
        shutdown_timeout=v.number(tree, "shutdown_timeout", "", DEFAULT_SHUTDOWN_TIMEOUT,
                                  strict=False),
        reload_timeout=v.number(tree, "reload_timeout", "", None),
        reaper=ReaperConfig(
            interval=v.number(reaper_tree, "interval", "reaper", DEFAULT_REAPER_INTERVAL),
            batch_size=v.integer(reaper_tree, "batch_size", "reaper", 100, minimum=1,
                                 maximum=100_000),
        ),
        health=HealthConfig(
            interval=v.number(health_tree, "interval", "health", DEFAULT_HEALTH_INTERVAL),
            max_pending_age=v.number(health_tree, "max_pending_age", "health",
                                     DEFAULT_MAX_PENDING_AGE),
        ),
        retention=retention,
        metrics=MetricsConfig(
            listen=listen,
            max_connections=v.integer(metrics_tree, "max_connections", "metrics",
                                      DEFAULT_METRICS_MAX_CONNECTIONS, minimum=1,
                                      maximum=MAX_METRICS_CONNECTIONS),
            request_timeout=v.number(metrics_tree, "request_timeout", "metrics",
                                     DEFAULT_METRICS_REQUEST_TIMEOUT, maximum=300),
        ),
        max_payload_bytes=max_payload_bytes,
        schedules=schedules,
        limits=_parse_limits(v, tree),
        source=source,
    )
    if v.problems:
        raise ConfigError(v.problems)
    return config


def _parse_retention(v: _Validator, tree: Mapping) -> RetentionConfig:
    section = v.section(tree, "retention", "", {"completed", "failed", "cancelled", "interval",
                                                "batch_size"})
    return RetentionConfig(
        completed=v.retention(section, "completed", "retention", DEFAULT_RETENTION_COMPLETED),
        failed=v.retention(section, "failed", "retention", DEFAULT_RETENTION_FAILED),
        cancelled=v.retention(section, "cancelled", "retention", DEFAULT_RETENTION_CANCELLED),
        interval=v.number(section, "interval", "retention", DEFAULT_RETENTION_INTERVAL),
        batch_size=v.integer(section, "batch_size", "retention", DEFAULT_RETENTION_BATCH_SIZE,
                             minimum=1, maximum=MAX_RETENTION_BATCH_SIZE),
    )


def _parse_database(v: _Validator, tree: Mapping, env: Mapping[str, str]) -> DatabaseConfig:
    db = v.section(tree, "database", "", {"dsn", "data_dir", "connect_timeout", "listen",
                                          "listen_dsn", "transaction_pooler"})
    if env.get(DSN_ENV):
        dsn = v.dsn(DSN_ENV, env[DSN_ENV])
    else:
        dsn = v.dsn("database.dsn", v.string(db, "dsn", "database", None) or None)
    return DatabaseConfig(
        dsn=dsn,
        data_dir=v.directory(db, "data_dir", "database", DEFAULT_DATA_DIR),
        connect_timeout=v.number(db, "connect_timeout", "database", 5.0, maximum=300),
        listen=v.boolean(db, "listen", "database", True),
        listen_dsn=v.dsn("database.listen_dsn",
                         v.string(db, "listen_dsn", "database", None) or None),
        transaction_pooler=v.boolean(db, "transaction_pooler", "database", False),
    )


def _parse_handlers(v: _Validator, tree: Mapping) -> HandlersConfig:
    section = v.section(tree, "handlers", "", {"path", "types"})
    types_tree = section.get("types") or {}
    types: dict[str, str] = {}
    policies: dict[str, RunPolicy] = {}
    if not isinstance(types_tree, dict):
        v.problem("handlers.types", f"must be a mapping of task type to module:function, "
                                    f"got {_type_name(types_tree)}")
    else:
        for task_type, spec in types_tree.items():
            where = f"handlers.types.{_key(task_type)}"
            if not isinstance(task_type, str) or not task_type:
                v.problem(where, "a task type must be a non-empty string")
                continue
            if isinstance(spec, dict):
                spec, policy = _parse_handler_mapping(v, spec, where)
                if policy != DEFAULT_POLICY:
                    policies[task_type] = policy
            if not isinstance(spec, str) or not _HANDLER_SPEC.match(spec):
                v.problem(where, f"must be 'module:function' (like 'echo:handle'), or a mapping "
                                 f"with handler, timeout and cancel, got {quote(spec)}")
            else:
                types[task_type] = spec
    return HandlersConfig(path=v.directory(section, "path", "handlers", DEFAULT_HANDLERS_PATH),
                          types=types, policies=policies)


def _parse_handler_mapping(v: _Validator, spec: dict, where: str) -> tuple[Any, RunPolicy]:
    """``{handler: module:function, timeout: seconds, cancel: cooperative | kill}``."""
    v.unknown(spec, where, {"handler", "timeout", "cancel"})
    cancel = v.string(spec, "cancel", where, "cooperative")
    if cancel not in CANCEL_MODES:
        v.problem(f"{where}.cancel", f"must be one of {', '.join(CANCEL_MODES)}, "
                                     f"got {quote(cancel)}")
        cancel = "cooperative"
    policy = RunPolicy(timeout=v.number(spec, "timeout", where, None), cancel=cancel)
    return spec.get("handler"), policy


def _parse_pools(v: _Validator, tree: Mapping, handlers: HandlersConfig) -> tuple[PoolConfig, ...]:
    raw = tree.get("pools")
    if raw is None:
        return (PoolConfig("default", 1, tuple(sorted(handlers.types))),)
    if not isinstance(raw, dict):
        v.problem("pools", f"must be a mapping of pool name to settings, got {_type_name(raw)}")
        return ()
    pools = []
    for name, settings in raw.items():
        where = f"pools.{_key(name)}"
        if not isinstance(name, str) or not _POOL_NAME.match(name):
            v.problem(where, "a pool name must be 1-40 letters, digits, '_' or '-'")
            continue
        settings = settings or {}
        if not isinstance(settings, dict):
            v.problem(where, f"must be a mapping, got {_type_name(settings)}")
            continue
        v.unknown(settings, where, {"processes", "task_types", "batch_size",
                                    "max_tasks_per_child", "max_memory_mb"})
        processes = v.integer(settings, "processes", where, 1, minimum=0,
                              maximum=MAX_PROCESSES)
        max_tasks = v.integer(settings, "max_tasks_per_child", where, None, minimum=1,
                              maximum=1_000_000_000)
        max_memory = v.number(settings, "max_memory_mb", where, None, maximum=1024 * 1024,
                              unit="megabytes")
        batch_size = v.integer(settings, "batch_size", where, 1, minimum=1,
                               maximum=MAX_BATCH_SIZE)
        task_types = settings.get("task_types")
        if task_types is None:
            chosen = tuple(sorted(handlers.types))
        elif not isinstance(task_types, list) or not all(isinstance(t, str) for t in task_types):
            v.problem(f"{where}.task_types", "must be a list of task type names")
            chosen = ()
        else:
            for t in task_types:
                if t not in handlers.types:
                    v.problem(f"{where}.task_types",
                              f"{quote(t)} has no handler under handlers.types")
            chosen = tuple(dict.fromkeys(task_types))
        pools.append(PoolConfig(name, processes, chosen, batch_size,
                                max_tasks_per_child=max_tasks, max_memory_mb=max_memory))
    return tuple(pools)


# Every instant's id has the same length; this one stands for all of them.
_ANY_INSTANT = datetime(2000, 1, 1, tzinfo=timezone.utc)
def _parse_limits(v: _Validator, tree: Mapping) -> dict[str, int]:
    raw = tree.get("limits")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        v.problem("limits", f"must be a mapping of task type to a number of tasks, "
                            f"got {_type_name(raw)}")
        return {}
    limits = {}
    for task_type, value in raw.items():
        where = f"limits.{_key(task_type)}"
        if not isinstance(task_type, str) or not task_type.strip() or \
                len(task_type) > MAX_TASK_TYPE_LENGTH or not task_type.isprintable():
            v.problem(where, f"a task type must be a non-empty printable string of at most "
                             f"{MAX_TASK_TYPE_LENGTH} characters")
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            v.problem(where, f"must be a whole number of tasks, got {_type_name(value)} "
                             f"{quote(value)}")
        elif not 1 <= value <= MAX_LIMIT:
            v.problem(where, f"must be from 1 to {MAX_LIMIT}, got {quote(value)} (to stop a "
                             f"type, pause it: pgtaskd pause TYPE)")
        else:
            limits[task_type] = value
    return limits


_SCHEDULE_KEYS = {"cron", "timezone", "task_type", "payload", "priority", "max_retries",
                  "catch_up", "max_catch_up"}


def _parse_schedules(v: _Validator, tree: Mapping,
                     max_payload_bytes: int) -> tuple[ScheduleConfig, ...]:
    raw = tree.get("schedules")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        v.problem("schedules", f"must be a mapping of schedule name to settings, "
                               f"got {_type_name(raw)}")
        return ()
    schedules = []
    for name, settings in raw.items():
        where = f"schedules.{_key(name)}"
        if not isinstance(name, str) or not _SCHEDULE_NAME.match(name):
            v.problem(where, "a schedule name must be 1-100 letters, digits, '_', '-' or '.'")
            continue
        if not isinstance(settings, dict):
            v.problem(where, f"must be a mapping with at least cron and task_type, "
                             f"got {_type_name(settings)}")
            continue
        v.unknown(settings, where, _SCHEDULE_KEYS)
        schedule = _parse_schedule(v, name, settings, where, max_payload_bytes)
        if schedule is not None:
            schedules.append(schedule)
    return tuple(schedules)


def _parse_schedule(v: _Validator, name: str, settings: Mapping, where: str,
                    max_payload_bytes: int) -> ScheduleConfig | None:
    before = len(v.problems)
    cron = _parse_cron(v, settings, where)
    task_type = settings.get("task_type")
    if task_type is None:
        v.problem(f"{where}.task_type", "is required: the type of the tasks to enqueue")
    payload = settings.get("payload")
    if payload is None:
        payload = {}
    elif not isinstance(payload, dict):
        v.problem(f"{where}.payload", f"must be a mapping (a JSON object), "
                                      f"got {_type_name(payload)}")
    catch_up = settings.get("catch_up", DEFAULT_CATCH_UP)
    if catch_up is None:
        catch_up = DEFAULT_CATCH_UP
    if catch_up not in CATCH_UP_POLICIES:
        v.problem(f"{where}.catch_up", f"must be one of {', '.join(CATCH_UP_POLICIES)}, "
                                       f"got {quote(catch_up)}")
    schedule = dict(
        name=name, cron=cron, task_type=task_type, payload=payload,
        priority=v.integer(settings, "priority", where, 0, minimum=INT32_MIN, maximum=INT32_MAX),
        max_retries=v.integer(settings, "max_retries", where, 3, minimum=0, maximum=INT32_MAX),
        catch_up=catch_up,
        max_catch_up=v.integer(settings, "max_catch_up", where, DEFAULT_MAX_CATCH_UP, minimum=1,
                               maximum=MAX_CATCH_UP_LIMIT))
    if task_type is not None and isinstance(payload, dict):
        _check_schedule_task(v, schedule, where, max_payload_bytes)
    if len(v.problems) > before:
        return None
    return ScheduleConfig(**schedule)


def _check_schedule_task(v: _Validator, schedule: dict, where: str,
                         max_payload_bytes: int) -> None:
    """The tasks go in through the client's own checks at every instant: the same checks now
    make a task type or a payload it would refuse a config problem, not a failing service."""
    from ..client import prepare_task  # imported here: the client imports this module

    try:
        prepare_task(schedule["task_type"], schedule["payload"], priority=schedule["priority"],
                     max_retries=schedule["max_retries"], name=schedule["name"],
                     task_id=schedule_task_id(schedule["name"], _ANY_INSTANT),
                     max_payload_bytes=max_payload_bytes)
    except UsageError as exc:
        field_name, _, reason = str(exc).partition(": ")
        if field_name in ("task_type", "payload"):
            v.problem(f"{where}.{field_name}", reason)
        else:
            v.problem(where, str(exc))


def _parse_cron(v: _Validator, settings: Mapping, where: str) -> Cron | None:
    expression = settings.get("cron")
    zone_name = settings.get("timezone")
    if zone_name is None:
        zone_name = DEFAULT_SCHEDULE_TIMEZONE
    valid = True
    try:
        load_zone(zone_name)
    except CronError as exc:
        v.problem(f"{where}.timezone", str(exc))
        valid = False
    if expression is None:
        v.problem(f"{where}.cron", "is required: a cron expression, like '30 2 * * *'")
        return None
    try:
        check_expression(expression)
    except CronError as exc:
        v.problem(f"{where}.cron", f"{exc}, got {quote(expression)}")
        return None
    return Cron(expression, zone_name) if valid else None


def resolve_config_path(explicit: str | os.PathLike | None,
                        env: Mapping[str, str] | None = None) -> Path | None:
    env = os.environ if env is None else env
    chosen = explicit or env.get(CONFIG_ENV)
    return Path(chosen) if chosen else None


def load_config(explicit: str | os.PathLike | None = None,
                env: Mapping[str, str] | None = None, *, text: str | None = None) -> Config:
    """Load the config named by ``-c``, else ``$PGTASKD_CONFIG``, else the built-in defaults.

    ``text``, if given, is the file's content as read earlier (a worker child gets the
    supervisor's snapshot): it is parsed instead of the file, which may have changed since.
    """
    path = resolve_config_path(explicit, env)
    if path is None:
        return parse_config({}, base_dir=Path.cwd(), env=env)
    if text is None:
        text = read_config_text(path)
    else:
        # A snapshot was read from the file by the supervisor, so this holds already; counting
        # characters (at most the bytes) keeps text that cannot be encoded from failing here.
        check_size(path, len(text))
    tree = parse_yaml(path, text)
    try:
        return parse_config(tree, base_dir=path.resolve().parent, path=path.resolve(), env=env,
                            source=text)
    except ConfigError as exc:
        raise ConfigError([f"{path}: {p}" for p in exc.problems]) from None
