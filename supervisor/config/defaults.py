"""The config's named values: environment variables, defaults and the bounds a config may ask for.

A default changes here and nowhere else. The limits of a task itself (the payload size, the
INTEGER range, the length of a task type) are the client's too, so they live with the checks of
a new task in ``supervisor.task_fields``; ``supervisor.config`` re-exports them.
"""

import os

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
# The daemon registry (maintenance/registry.py): a heartbeat every few seconds is one small
# write per daemon; past a few missed ones the daemon shows as lost (never sooner than
# REGISTRY_LOST_FLOOR, so that one slow statement is no loss); rows silent for a day go.
DEFAULT_REGISTRY_INTERVAL = 5.0
MIN_REGISTRY_INTERVAL = 1.0
MAX_REGISTRY_INTERVAL = 300.0
REGISTRY_LOST_BEATS = 3
REGISTRY_LOST_FLOOR = 10.0
REGISTRY_KEPT_SECONDS = 86400.0
DEFAULT_MAX_PENDING_AGE = 300.0
DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
DEFAULT_METRICS_MAX_CONNECTIONS = 64
DEFAULT_METRICS_REQUEST_TIMEOUT = 5.0
# Beside the config file (relative paths in a config are read from its folder).
DEFAULT_DATA_DIR = "var/pgdata"
# The web console (pgtaskd web).
DEFAULT_WEB_LISTEN = "127.0.0.1:8464"
DEFAULT_WEB_MAX_CONNECTIONS = 64
DEFAULT_WEB_REQUEST_TIMEOUT = 10.0
DEFAULT_WEB_REFRESH_INTERVAL = 1.0
DEFAULT_WEB_DB_CONNECTIONS = 4
MAX_WEB_DB_CONNECTIONS = 32
MIN_WEB_REFRESH_INTERVAL = 0.5
DEFAULT_HANDLERS_PATH = "handlers"
MAX_BATCH_SIZE = 1000
# A child's claims at once (pools.<name>.concurrency): far past what one event loop serves
# well, and each held claim is a lease the supervisor renews.
MAX_CONCURRENCY = 1000
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
# Floors, for the same reason from below: a loop timed by 1e-9 s never sleeps, so an idle
# daemon burns a core and fills the database with statements, and a lease of a millisecond
# fails a task before it runs. Each floor is far below any setting that makes sense and far
# above a spin:
# - a lease shorter than a second is shorter than one renewal may wait for its answer (the
#   keeper gives a statement at least a second), so it lapses under any load;
# - a worker polls once per poll_interval when idle: 100 queries a second per child at most;
# - the reaper, health and retention passes, renewals and timeouts are each a statement or a
#   connection attempt: at most ten a second, and a timeout shorter than a round trip on a
#   busy host fails work that was fine;
# - max_pending_age below a second would call the queue unhealthy whenever a task is due.
# shutdown_timeout and the retry delays have none: 0 means "at once" there, and nothing loops.
MIN_LEASE_SECONDS = 1.0
MIN_RENEW_INTERVAL = 0.1
MIN_POLL_INTERVAL = 0.01
MIN_PASS_INTERVAL = 0.1
MIN_TIMEOUT = 0.1
MIN_PENDING_AGE = 1.0
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
# A catch-up enqueues its tasks in one transaction (in statements of bounded size: see
# maintenance/scheduler.py); past this many, a schedule is a backfill, which is a job for
# submit_many.
MAX_CATCH_UP_LIMIT = 10_000
DEFAULT_SCHEDULE_TIMEZONE = "UTC"


def user_data_dir(env) -> str:
    """The embedded server's folder when no config file is named: one place per user, so that
    a command run from any folder finds the same database (from the working directory, each
    folder got a new, empty cluster). $XDG_DATA_HOME/pgtaskd/pgdata, else
    ~/.local/share/pgtaskd/pgdata."""
    home = env.get("HOME") or os.path.expanduser("~")
    base = env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
    return os.path.join(base, "pgtaskd", "pgdata")
