"""The metrics worker children record.

In the daemon, the parent sets ``PROMETHEUS_MULTIPROC_DIR`` before any child starts, so each
child writes these to its own files there and the parent's /metrics sums every child, those
that already exited included. Gauges about the queue are not recorded here: the parent reads
them from the database at scrape time (see maintenance/http.py).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

_TASK = ("pool", "task_type")

TASKS_CLAIMED = Counter("pgtaskd_tasks_claimed", "Tasks claimed by a worker", _TASK)
TASKS_COMPLETED = Counter("pgtaskd_tasks_completed", "Tasks completed", _TASK)
TASKS_FAILED = Counter("pgtaskd_tasks_failed", "Tasks marked FAILED (retries spent or permanent)",
                       _TASK)
TASKS_RETRIED = Counter("pgtaskd_tasks_retried", "Failed runs scheduled for another try", _TASK)
TASKS_CANCELLED = Counter("pgtaskd_tasks_cancelled",
                          "Runs stopped because their task was cancelled", _TASK)
STALE_RESULTS = Counter("pgtaskd_stale_results_discarded",
                        "Results dropped because the worker no longer owned the task", _TASK)
LEASE_RENEWALS = Counter("pgtaskd_lease_renewals", "Successful lease renewals", _TASK)
LOOP_ERRORS = Counter("pgtaskd_loop_errors", "Errors in a worker's claim-run-finalize loop",
                      ("pool",))
TASK_DURATION = Histogram(
    "pgtaskd_task_duration_seconds", "Handler run time, by outcome",
    ("pool", "task_type", "outcome"),
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)

TASK_CPU = Histogram(
    "pgtaskd_task_cpu_seconds", "CPU time of each run (the worker and the subprocesses it "
    "waited for)", _TASK,
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 1800))
TASK_PEAK_RSS = Histogram(
    "pgtaskd_task_peak_rss_bytes", "Peak resident memory of the worker during each run", _TASK,
    buckets=tuple(mib * 1024 * 1024 for mib in (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)))
WORKERS_RECYCLED = Counter("pgtaskd_workers_recycled",
                           "Children that exited to be replaced (max_tasks_per_child, "
                           "max_memory_mb)", ("pool", "reason"))

# Recorded by the supervisor itself.
RELOADS = Counter("pgtaskd_reloads", "Reloads (SIGHUP) by how they ended", ("outcome",))
WORKER_RESTARTS = Counter("pgtaskd_worker_restarts", "Worker children started again after an exit",
                          ("pool",))
TASKS_RESCUED = Counter("pgtaskd_tasks_rescued",
                        "Claims of dead children settled at once by the supervisor",
                        ("pool", "task_type"))
TASKS_TIMED_OUT = Counter("pgtaskd_tasks_timed_out",
                          "Runs the supervisor stopped past their type's timeout", _TASK)
CANCEL_KILLS = Counter("pgtaskd_cancel_kills",
                       "Children killed because the task they ran was cancelled (cancel: kill)",
                       _TASK)
LEASES_REAPED = Counter("pgtaskd_leases_reaped", "Expired leases returned to PENDING or FAILED",
                        ("task_type", "status"))
TASKS_SCHEDULED = Counter("pgtaskd_tasks_scheduled",
                          "Tasks a schedule enqueued (those this daemon inserted first)",
                          ("schedule",))
TASKS_DELETED = Counter("pgtaskd_tasks_deleted", "Finished tasks deleted by retention",
                        ("status",))
HTTP_CONNECTIONS_DROPPED = Counter(
    "pgtaskd_http_connections_dropped",
    "Connections to /metrics and /healthz closed without an answer, or refused",
    ("reason",))  # timeout, over_capacity, evicted, too_large, bad_request


# A counter that has never counted has no sample, so rate() and alerts see nothing until its
# first event. Each process creates its known label sets at zero when it starts.
_WORKER_COUNTERS = (TASKS_CLAIMED, TASKS_COMPLETED, TASKS_FAILED, TASKS_RETRIED,
                    TASKS_CANCELLED, STALE_RESULTS, LEASE_RENEWALS)


def start_worker_counters(pool: str, task_types) -> None:
    """A worker child's: every (pool, task type) it may count, its loop's errors and its
    recycling reasons."""
    for task_type in task_types:
        for counter in _WORKER_COUNTERS:
            counter.labels(pool, task_type)
    LOOP_ERRORS.labels(pool)
    for reason in RECYCLE_REASONS:
        WORKERS_RECYCLED.labels(pool, reason)


# The reasons a child recycles (worker/loop.py labels each by its setting), the statuses the
# reaper and retention count, and the reasons the HTTP server drops a connection.
RECYCLE_REASONS = ("max_tasks_per_child", "max_memory_mb")
REAPED_STATUSES = ("PENDING", "FAILED")
DELETED_STATUSES = ("COMPLETED", "FAILED", "CANCELLED")
DROP_REASONS = ("timeout", "over_capacity", "evicted", "too_large", "bad_request")


def start_supervisor_counters(pools, task_types, schedules=()) -> None:
    """The supervisor's own: reloads by outcome; restarts by pool; rescues, timeouts and
    cancel kills by pool and type; the reaper's reaps, failures and retries by type; what
    schedules enqueue; what retention deletes; the HTTP server's drops. Called again after a
    reload for its new pools, types and schedules."""
    for outcome in ("succeeded", "failed"):
        RELOADS.labels(outcome)
    for pool in pools:
        WORKER_RESTARTS.labels(pool)
        for task_type in task_types:
            for counter in (TASKS_RESCUED, TASKS_TIMED_OUT, CANCEL_KILLS):
                counter.labels(pool, task_type)
    for task_type in task_types:
        for status in REAPED_STATUSES:
            LEASES_REAPED.labels(task_type, status)
        # The reaper counts its failures and retries under the pool "reaper".
        TASKS_FAILED.labels("reaper", task_type)
        TASKS_RETRIED.labels("reaper", task_type)
    for schedule in schedules:
        TASKS_SCHEDULED.labels(schedule)
    for status in DELETED_STATUSES:
        TASKS_DELETED.labels(status)
    for reason in DROP_REASONS:
        HTTP_CONNECTIONS_DROPPED.labels(reason)
