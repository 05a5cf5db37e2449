"""Loading a config: which file, its top-level keys, and the small sections read in place.

``load_config`` picks the file (``-c``, else ``$PGTASKD_CONFIG``, else the built-in defaults)
and ``parse_config`` turns its tree into a ``Config`` or one ConfigError listing every
problem. Relative paths are resolved against the config file's folder, so a config works the
same whatever the daemon's working directory is.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Mapping

from ..errors import ConfigError, quote
from ..lease_timing import renewal_problem
from ..task_fields import DEFAULT_MAX_PAYLOAD_BYTES
from .defaults import (CONFIG_ENV, DEFAULT_DATA_DIR, DEFAULT_HEALTH_INTERVAL,
                       DEFAULT_LEASE_SECONDS, DEFAULT_MAX_PENDING_AGE, DEFAULT_METRICS_LISTEN,
                       DEFAULT_METRICS_MAX_CONNECTIONS, DEFAULT_METRICS_REQUEST_TIMEOUT,
                       DEFAULT_POLL_INTERVAL, DEFAULT_REAPER_INTERVAL,
                       DEFAULT_REGISTRY_INTERVAL, DEFAULT_RENEW_INTERVAL,
                       DEFAULT_RETENTION_BATCH_SIZE, DEFAULT_RETENTION_CANCELLED,
                       DEFAULT_RETENTION_COMPLETED, DEFAULT_RETENTION_FAILED,
                       DEFAULT_RETENTION_INTERVAL, DEFAULT_RETRY_BASE_DELAY, DEFAULT_RETRY_JITTER,
                       DEFAULT_RETRY_MAX_DELAY, DEFAULT_SHUTDOWN_TIMEOUT, DSN_ENV, MAX_LIMIT,
                       MAX_METRICS_CONNECTIONS, MAX_PAYLOAD_LIMIT, MAX_RETENTION_BATCH_SIZE,
                       MAX_REGISTRY_INTERVAL, MIN_LEASE_SECONDS, MIN_PASS_INTERVAL,
                       MIN_PENDING_AGE, MIN_POLL_INTERVAL, MIN_REGISTRY_INTERVAL,
                       MIN_RENEW_INTERVAL, MIN_TIMEOUT, user_data_dir)
from .model import (Config, DatabaseConfig, HealthConfig, LeaseConfig, LoggingConfig,
                    MetricsConfig, ReaperConfig, RegistryConfig, RetentionConfig, RetryConfig)
from ..logs import FORMATS as LOG_FORMATS, LEVELS as LOG_LEVELS
from .handler_pools import parse_handlers, parse_pools
from .schedules import parse_schedules
from .web import parse_web
from .validator import Validator, shown_key, type_name
from .yaml_file import check_size, parse_yaml, read_config_text


_TOP_KEYS = {"database", "lease", "poll_interval", "retry", "handlers", "pools",
             "shutdown_timeout", "reload_timeout", "reaper", "health", "retention",
             "metrics", "logging", "max_payload_bytes", "schedules", "limits", "registry",
             "web"}


def parse_config(tree: Any, *, base_dir: Path, path: Path | None = None,
                 env: Mapping[str, str] | None = None, source: str | None = None) -> Config:
    """Build a Config from a parsed YAML tree, or raise ConfigError listing every problem.
    Without a file (``path`` None), the embedded server's default folder is the user's."""
    env = os.environ if env is None else env
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(f"(top level): must be a mapping of keys, got {type_name(tree)}")
    v = Validator(base_dir)
    v.unknown(tree, "", _TOP_KEYS)

    database = _parse_database(v, tree, env,
                               DEFAULT_DATA_DIR if path else user_data_dir(env))

    lease_tree = v.section(tree, "lease", "", {"seconds", "renew_interval"})
    before_lease = len(v.problems)
    seconds = v.number(lease_tree, "seconds", "lease", DEFAULT_LEASE_SECONDS,
                       minimum=MIN_LEASE_SECONDS, strict=False)
    # Unset, the renewal follows the lease: a third of it (10 s for the default 30 s), so
    # that shortening only lease.seconds never trips the check below.
    lease = LeaseConfig(
        seconds=seconds,
        renew_interval=v.number(lease_tree, "renew_interval", "lease",
                                seconds * DEFAULT_RENEW_INTERVAL / DEFAULT_LEASE_SECONDS,
                                minimum=MIN_RENEW_INTERVAL, strict=False),
    )
    renewal = renewal_problem(lease.seconds, lease.renew_interval)
    if renewal and len(v.problems) == before_lease:  # not a default standing in for a typo
        v.problem("lease.renew_interval", renewal)

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

    handlers = parse_handlers(v, tree)
    pools = parse_pools(v, tree, handlers)

    reaper_tree = v.section(tree, "reaper", "", {"interval", "batch_size"})
    health_tree = v.section(tree, "health", "", {"interval", "max_pending_age"})
    registry_tree = v.section(tree, "registry", "", {"interval"})
    retention = _parse_retention(v, tree)
    metrics_tree = v.section(tree, "metrics", "", {"listen", "max_connections",
                                                   "request_timeout"})
    listen = parse_listen(v, v.string(metrics_tree, "listen", "metrics",
                                      DEFAULT_METRICS_LISTEN) or "")

    max_payload_bytes = v.integer(tree, "max_payload_bytes", "", DEFAULT_MAX_PAYLOAD_BYTES,
                                  minimum=2, maximum=MAX_PAYLOAD_LIMIT)
    schedules = parse_schedules(v, tree, max_payload_bytes)

    config = Config(
        path=path,
        database=database,
        lease=lease,
        poll_interval=v.number(tree, "poll_interval", "", DEFAULT_POLL_INTERVAL, maximum=3600,
                               minimum=MIN_POLL_INTERVAL, strict=False),
        retry=retry,
        handlers=handlers,
        pools=pools,
        shutdown_timeout=v.number(tree, "shutdown_timeout", "", DEFAULT_SHUTDOWN_TIMEOUT,
                                  strict=False),
        reload_timeout=v.number(tree, "reload_timeout", "", None, minimum=MIN_TIMEOUT,
                                strict=False),
        reaper=ReaperConfig(
            interval=v.number(reaper_tree, "interval", "reaper", DEFAULT_REAPER_INTERVAL,
                              minimum=MIN_PASS_INTERVAL, strict=False),
            batch_size=v.integer(reaper_tree, "batch_size", "reaper", 100, minimum=1,
                                 maximum=100_000),
        ),
        health=HealthConfig(
            interval=v.number(health_tree, "interval", "health", DEFAULT_HEALTH_INTERVAL,
                              minimum=MIN_PASS_INTERVAL, strict=False),
            max_pending_age=v.number(health_tree, "max_pending_age", "health",
                                     DEFAULT_MAX_PENDING_AGE, minimum=MIN_PENDING_AGE,
                                     strict=False),
        ),
        registry=RegistryConfig(
            interval=v.number(registry_tree, "interval", "registry", DEFAULT_REGISTRY_INTERVAL,
                              minimum=MIN_REGISTRY_INTERVAL, maximum=MAX_REGISTRY_INTERVAL,
                              strict=False),
        ),
        retention=retention,
        metrics=MetricsConfig(
            listen=listen,
            max_connections=v.integer(metrics_tree, "max_connections", "metrics",
                                      DEFAULT_METRICS_MAX_CONNECTIONS, minimum=1,
                                      maximum=MAX_METRICS_CONNECTIONS),
            request_timeout=v.number(metrics_tree, "request_timeout", "metrics",
                                     DEFAULT_METRICS_REQUEST_TIMEOUT, maximum=300,
                                     minimum=MIN_TIMEOUT, strict=False),
        ),
        logging=_parse_logging(v, tree),
        max_payload_bytes=max_payload_bytes,
        schedules=schedules,
        limits=_parse_limits(v, tree),
        web=parse_web(v, tree),
        source=source,
    )
    if v.problems:
        raise ConfigError(v.problems)
    return config


def parse_listen(v: Validator, listen: str, key: str = "metrics.listen",
                 default: str = DEFAULT_METRICS_LISTEN) -> str:
    """``address:port`` of the metrics endpoint (or the console's, ``key``), or "" (off).

    The address must be an IP literal. A host name would be resolved when the daemon binds,
    by whatever DNS says then: check-config could not tell whether the endpoint, which has no
    authentication, is reachable from other hosts, and a lookup that fails or changes would
    fail a start or a reload. Port 0 would bind a port chosen at random that no scraper finds.
    """
    if not listen:
        return ""
    match = re.match(r"^(?:\[([^\]]*)\]|([^:\s\[\]]+)):(\d{1,5})$", listen)
    if not match:
        v.problem(key,
                  f"must be address:port (like 127.0.0.1:9464 or [::1]:9464), got {quote(listen)}")
        return default
    literal, port = match.group(1) or match.group(2), int(match.group(3))
    version = 6 if match.group(1) is not None else 4
    try:
        address = ipaddress.ip_address(literal)
    except ValueError:
        address = None
    if address is None or address.version != version:
        v.problem(key,
                  f"must be an IP address (like 127.0.0.1 or [::1]), not a host name, which "
                  f"would be resolved only at bind time, got {quote(listen)}")
        return default
    if not 1 <= port <= 65535:
        v.problem(key, f"port must be from 1 to 65535, got {quote(listen)}")
        return default
    return listen


def _parse_retention(v: Validator, tree: Mapping) -> RetentionConfig:
    section = v.section(tree, "retention", "", {"completed", "failed", "cancelled", "interval",
                                                "batch_size"})
    return RetentionConfig(
        completed=v.retention(section, "completed", "retention", DEFAULT_RETENTION_COMPLETED),
        failed=v.retention(section, "failed", "retention", DEFAULT_RETENTION_FAILED),
        cancelled=v.retention(section, "cancelled", "retention", DEFAULT_RETENTION_CANCELLED),
        interval=v.number(section, "interval", "retention", DEFAULT_RETENTION_INTERVAL,
                          minimum=MIN_PASS_INTERVAL, strict=False),
        batch_size=v.integer(section, "batch_size", "retention", DEFAULT_RETENTION_BATCH_SIZE,
                             minimum=1, maximum=MAX_RETENTION_BATCH_SIZE),
    )


def _parse_database(v: Validator, tree: Mapping, env: Mapping[str, str],
                    default_data_dir: str) -> DatabaseConfig:
    db = v.section(tree, "database", "", {"dsn", "data_dir", "connect_timeout", "listen",
                                          "listen_dsn", "transaction_pooler"})
    if env.get(DSN_ENV):
        dsn = v.dsn(DSN_ENV, env[DSN_ENV])
    else:
        dsn = v.dsn("database.dsn", v.string(db, "dsn", "database", None) or None)
    return DatabaseConfig(
        dsn=dsn,
        data_dir=v.directory(db, "data_dir", "database", default_data_dir),
        connect_timeout=v.number(db, "connect_timeout", "database", 5.0, maximum=300,
                                 minimum=MIN_TIMEOUT, strict=False),
        listen=v.boolean(db, "listen", "database", True),
        listen_dsn=v.dsn("database.listen_dsn",
                         v.string(db, "listen_dsn", "database", None) or None),
        transaction_pooler=v.boolean(db, "transaction_pooler", "database", False),
    )



def _parse_logging(v: Validator, tree: Mapping) -> LoggingConfig:
    section = v.section(tree, "logging", "", {"format", "level"})
    return LoggingConfig(format=v.choice(section, "format", "logging", "auto", LOG_FORMATS),
                         level=v.choice(section, "level", "logging", "info", LOG_LEVELS))


def _parse_limits(v: Validator, tree: Mapping) -> dict[str, int]:
    raw = tree.get("limits")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        v.problem("limits", f"must be a mapping of task type to a number of tasks, "
                            f"got {type_name(raw)}")
        return {}
    limits = {}
    for task_type, value in raw.items():
        where = f"limits.{shown_key(task_type)}"
        if not v.task_type(where, task_type):
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            v.problem(where, f"must be a whole number of tasks, got {type_name(value)} "
                             f"{quote(value)}")
        elif not 1 <= value <= MAX_LIMIT:
            v.problem(where, f"must be from 1 to {MAX_LIMIT}, got {quote(value)} (to stop a "
                             f"type, pause it: pgtaskd pause TYPE)")
        else:
            limits[task_type] = value
    return limits



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
