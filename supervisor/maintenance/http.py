"""GET /metrics (Prometheus text, summed over every worker child) and GET /healthz (JSON).

Worker counters come from prometheus_client's multiprocess files, which outlive the child that
wrote them, so a restarted child never makes a counter go backwards; the files of dead
children are folded into archive files (metrics_archive.py), so a scrape stays cheap. Queue
gauges come from the health checker's latest report, read at scrape time, not from
per-process files.
"""

from __future__ import annotations

import json
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from .. import __version__
from ..config import FINISHED_STATUSES
from ..db.queue_figures import OTHER_TYPES, TypeFigures
from ..logs import emit
from .health import HealthChecker
from .http_server import BoundedHTTPServer, Response, Route
from .metrics_archive import ArchiveCollector, MetricsArchive

class QueueCollector:
    """Gauges about the queue and the daemon, from the latest health report."""

    def __init__(self, health: HealthChecker):
        self.health = health

    def collect(self):
        report = self.health.latest()
        by_type = report.by_type or {t: TypeFigures(0, 0, None, {})
                                     for t in (*sorted(self.health.known_types), OTHER_TYPES)}
        # PENDING and RUNNING by type (the types the configs name, the rest under _other);
        # the finished statuses, estimated on a large table and deleted by retention, have
        # no type: their task_type is empty, which Prometheus reads as no label at all.
        tasks = GaugeMetricFamily("pgtaskd_tasks", "Tasks in the table, by status and task "
                                  "type (where pgtaskd_tasks_estimated is 1, an estimate or a "
                                  "lower bound)", labels=["status", "task_type"])
        estimated = GaugeMetricFamily("pgtaskd_tasks_estimated",
                                      "1 where pgtaskd_tasks{status,task_type} is an estimate "
                                      "or a lower bound, 0 where it is exact",
                                      labels=["status", "task_type"])
        for task_type, figures in by_type.items():
            for status, count in (("PENDING", figures.pending), ("RUNNING", figures.running)):
                tasks.add_metric([status, task_type], count)
            estimated.add_metric(["PENDING", task_type], 1 if "pending" in figures.not_exact
                                 else 0)
            estimated.add_metric(["RUNNING", task_type], 0)
        for status in FINISHED_STATUSES:
            tasks.add_metric([status, ""], report.tasks_by_status.get(status, 0))
            estimated.add_metric([status, ""],
                                 1 if f"tasks_by_status.{status}" in report.not_exact else 0)
        yield tasks
        yield estimated
        yield GaugeMetricFamily("pgtaskd_expired_leases", "RUNNING tasks whose lease expired "
                                "(counted up to 1,001)", value=report.expired_leases)
        age = GaugeMetricFamily("pgtaskd_oldest_pending_age_seconds",
                                "How long the oldest due PENDING task of a type has waited (0: "
                                "none is due), paused types included", labels=["task_type"])
        for task_type, figures in by_type.items():
            age.add_metric([task_type], figures.oldest_due_age or 0.0)
        yield age
        # One sample per paused type, value 1; a type that is not paused has none.
        paused = GaugeMetricFamily("pgtaskd_task_type_paused",
                                   "1 for each task type paused fleet-wide (pgtaskd pause)",
                                   labels=["task_type"])
        for task_type in report.paused_types:
            paused.add_metric([task_type], 1)
        yield paused
        limit = GaugeMetricFamily("pgtaskd_task_type_limit",
                                  "Global concurrency limit of a task type (pgtaskd limit)",
                                  labels=["task_type"])
        running = GaugeMetricFamily("pgtaskd_task_type_limit_running",
                                    "Tasks of a limited type running under a live lease",
                                    labels=["task_type"])
        for task_type, (max_running, now_running) in report.limits.items():
            limit.add_metric([task_type], max_running)
            running.add_metric([task_type], now_running)
        yield limit
        yield running
        yield GaugeMetricFamily("pgtaskd_live_children", "Worker children alive",
                                value=report.children.live)
        yield GaugeMetricFamily("pgtaskd_expected_children", "Worker children configured",
                                value=report.children.expected)
        # One sample per pool whose restart fuse blew, value 1, until a reload re-arms it.
        fused = GaugeMetricFamily("pgtaskd_pool_fused", "1 for each pool whose children "
                                  "crashed in a loop and are not restarted until a reload",
                                  labels=["pool"])
        for pool in report.children.fused_pools:
            fused.add_metric([pool], 1)
        yield fused
        yield GaugeMetricFamily("pgtaskd_database_up", "1 if the last health check reached PostgreSQL",
                                value=1 if report.database_ok else 0)
        build = GaugeMetricFamily("pgtaskd_build_info", "1, labelled with the running version",
                                  labels=["version"])
        build.add_metric([__version__], 1)
        yield build


class ReloadCollector:
    """The config generation running, and whether the latest reload failed."""

    def __init__(self, reload_facts: Callable[[], tuple]):
        self.reload_facts = reload_facts

    def collect(self):
        generation, failure = self.reload_facts()
        yield GaugeMetricFamily("pgtaskd_config_generation", "The config generation the "
                                "daemon runs (1 at start, one more per reload that succeeded)",
                                value=generation)
        yield GaugeMetricFamily("pgtaskd_reload_failed", "1 while the latest reload failed "
                                "(the daemon runs on with the config before it)",
                                value=1 if failure else 0)


def render_metrics(health: HealthChecker, archive: MetricsArchive,
                   reload_facts: Callable[[], tuple]) -> Response:
    """Every child's counters, summed from their files and the archive of the dead ones,
    and the queue gauges."""
    registry = CollectorRegistry()
    registry.register(ArchiveCollector(archive))
    registry.register(QueueCollector(health))
    registry.register(ReloadCollector(reload_facts))
    return Response(200, CONTENT_TYPE_LATEST, generate_latest(registry))


# The supervisor's loop passes at least every half second; a loop silent this long is
# stuck (a deadlock, a freeze), whatever the database and the queue say.
LIVENESS_WINDOW = 15.0


def render_livez(loop_age: Callable[[], float]) -> Response:
    """Liveness apart from readiness: the process answers and its main loop turns. Nothing
    about the database or the queue, so a probe restarts only a daemon that is stuck."""
    age = loop_age()
    alive = age < LIVENESS_WINDOW
    body = {"status": "alive" if alive else "stuck", "loop_age_seconds": round(age, 3)}
    return Response(200 if alive else 503, "application/json",
                    json.dumps(body).encode() + b"\n")


def render_healthz(health: HealthChecker, reload_facts: Callable[[], tuple]) -> Response:
    body = health.latest().as_json()
    code = 200 if body["status"] == "ok" else 503
    generation, reload_failure = reload_facts()
    body["config_generation"] = generation
    # A warning, never a failure: the daemon runs on with the config it had.
    body["warnings"] = {"reload": f"the last reload failed: {reload_failure}"} \
        if reload_failure else {}
    return Response(code, "application/json", json.dumps(body).encode() + b"\n")


def count_drop(reason: str) -> None:
    from .. import metrics

    metrics.HTTP_CONNECTIONS_DROPPED.labels(reason).inc()


class MetricsServer:
    """/metrics and /healthz on a BoundedHTTPServer (see http_server.py for its limits)."""

    def __init__(self, address: tuple[str, int], health: HealthChecker,
                 archive: MetricsArchive, loop_age: Callable[[], float] = lambda: 0.0,
                 reload_facts: Callable[[], tuple] = lambda: (1, None), *,
                 max_connections: int, request_timeout: float):
        routes = {
            # Reads a file per process: a render thread. The others read memory: the loop.
            "/metrics": Route(lambda: render_metrics(health, archive, reload_facts),
                              blocking=True),
            "/healthz": Route(lambda: render_healthz(health, reload_facts)),
            "/readyz": Route(lambda: render_healthz(health, reload_facts)),
            "/livez": Route(lambda: render_livez(loop_age)),
        }
        self.server = BoundedHTTPServer(address, routes, max_connections=max_connections,
                                        request_timeout=request_timeout, on_drop=count_drop)

    @property
    def port(self) -> int:
        return self.server.address[1]

    def start(self) -> None:
        self.server.start()
        emit("http_listening", address=f"{self.server.address[0]}:{self.port}",
             max_connections=self.server.max_connections,
             request_timeout=self.server.request_timeout)

    def stop(self) -> None:
        self.server.stop()
