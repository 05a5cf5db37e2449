"""The YAML config: frozen dataclasses, defaults in one place, validation that names key paths.

Every problem found is collected (not just the first) so that ``pgtaskd check-config`` can
print one line per problem. ``defaults`` holds the named values, ``model`` the dataclasses,
``validator`` the typed readers, ``loader`` the file's top level, ``handler_pools`` and
``schedules`` their sections, ``yaml_file`` the reading of the file. Callers import from here.
"""

from ..task_fields import (DEFAULT_MAX_PAYLOAD_BYTES, INT32_MAX, INT32_MIN,
                           MAX_TASK_TYPE_LENGTH)
from .defaults import (CANCEL_MODES, CATCH_UP_POLICIES, CONFIG_ENV, CONFIG_SNAPSHOT_ENV,
                       DEFAULT_CATCH_UP, DEFAULT_DATA_DIR, DEFAULT_HANDLERS_PATH,
                       DEFAULT_HEALTH_INTERVAL, DEFAULT_LEASE_SECONDS, DEFAULT_MAX_CATCH_UP,
                       DEFAULT_MAX_PENDING_AGE, DEFAULT_METRICS_LISTEN,
                       DEFAULT_METRICS_MAX_CONNECTIONS, DEFAULT_METRICS_REQUEST_TIMEOUT,
                       DEFAULT_POLL_INTERVAL, DEFAULT_REAPER_INTERVAL, DEFAULT_RENEW_INTERVAL,
                       DEFAULT_RETENTION_BATCH_SIZE, DEFAULT_RETENTION_CANCELLED,
                       DEFAULT_RETENTION_COMPLETED, DEFAULT_RETENTION_FAILED,
                       DEFAULT_RETENTION_INTERVAL, DEFAULT_RETRY_BASE_DELAY, DEFAULT_RETRY_JITTER,
                       DEFAULT_RETRY_MAX_DELAY, DEFAULT_SCHEDULE_TIMEZONE,
                       DEFAULT_SHUTDOWN_TIMEOUT, DSN_ENV, FINISHED_STATUSES, MAX_BATCH_SIZE,
                       MAX_CONCURRENCY,
                       MAX_CATCH_UP_LIMIT, MAX_LIMIT, MAX_METRICS_CONNECTIONS, MAX_PAYLOAD_LIMIT,
                       MAX_PROCESSES, MAX_RETENTION_BATCH_SIZE, MAX_RETENTION_SECONDS, MAX_SECONDS,
                       REGISTRY_KEPT_SECONDS, REGISTRY_LOST_BEATS, REGISTRY_LOST_FLOOR)
from .loader import load_config, parse_config, resolve_config_path
from .model import (DEFAULT_POLICY, Config, DatabaseConfig, HandlersConfig, HealthConfig,
                    LeaseConfig, MetricsConfig, PoolConfig, ReaperConfig, RegistryConfig,
                    RetentionConfig, RetryConfig, RunPolicy, ScheduleConfig, WebAuthConfig,
                    WebConfig, schedule_task_id)

__all__ = [
    "CANCEL_MODES", "CATCH_UP_POLICIES", "CONFIG_ENV", "CONFIG_SNAPSHOT_ENV", "DEFAULT_CATCH_UP",
    "DEFAULT_DATA_DIR", "DEFAULT_HANDLERS_PATH", "DEFAULT_HEALTH_INTERVAL",
    "DEFAULT_LEASE_SECONDS", "DEFAULT_MAX_CATCH_UP", "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_PENDING_AGE", "DEFAULT_METRICS_LISTEN", "DEFAULT_METRICS_MAX_CONNECTIONS",
    "DEFAULT_METRICS_REQUEST_TIMEOUT", "DEFAULT_POLICY", "DEFAULT_POLL_INTERVAL",
    "DEFAULT_REAPER_INTERVAL", "DEFAULT_RENEW_INTERVAL", "DEFAULT_RETENTION_BATCH_SIZE",
    "DEFAULT_RETENTION_CANCELLED", "DEFAULT_RETENTION_COMPLETED", "DEFAULT_RETENTION_FAILED",
    "DEFAULT_RETENTION_INTERVAL", "DEFAULT_RETRY_BASE_DELAY", "DEFAULT_RETRY_JITTER",
    "DEFAULT_RETRY_MAX_DELAY", "DEFAULT_SCHEDULE_TIMEZONE", "DEFAULT_SHUTDOWN_TIMEOUT",
    "DSN_ENV", "FINISHED_STATUSES", "INT32_MAX", "INT32_MIN", "MAX_BATCH_SIZE", "MAX_CONCURRENCY",
    "MAX_CATCH_UP_LIMIT", "MAX_LIMIT", "MAX_METRICS_CONNECTIONS", "MAX_PAYLOAD_LIMIT",
    "MAX_PROCESSES", "MAX_RETENTION_BATCH_SIZE", "MAX_RETENTION_SECONDS", "MAX_SECONDS",
    "MAX_TASK_TYPE_LENGTH", "Config", "DatabaseConfig", "HandlersConfig", "HealthConfig",
    "LeaseConfig", "MetricsConfig", "PoolConfig", "REGISTRY_KEPT_SECONDS",
    "REGISTRY_LOST_BEATS", "REGISTRY_LOST_FLOOR", "ReaperConfig", "RegistryConfig",
    "RetentionConfig", "RetryConfig", "RunPolicy", "ScheduleConfig", "WebAuthConfig",
    "WebConfig", "load_config", "parse_config",
    "resolve_config_path", "schedule_task_id",
]
