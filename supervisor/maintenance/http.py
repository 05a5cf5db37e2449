"""GET /metrics (Prometheus text, summed over every worker child) and GET /healthz (JSON).

Worker counters come from prometheus_client's multiprocess files, which outlive the child that
wrote them, so a restarted child never makes a counter go backwards. Queue gauges come from
the health checker's latest report, read at scrape time, not from per-process files.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from ..logs import emit
from .health import HealthChecker

STATUSES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED")


class QueueCollector:
    """Gauges about the queue and the daemon, from the latest health report."""

    def __init__(self, health: HealthChecker):
        self.health = health

    def collect(self):
        report = self.health.latest()
        tasks = GaugeMetricFamily("pgtaskd_tasks", "Tasks in the table, by status", labels=["status"])
        for status in STATUSES:
            tasks.add_metric([status], report.tasks_by_status.get(status, 0))
        yield tasks
        yield GaugeMetricFamily("pgtaskd_expired_leases", "RUNNING tasks whose lease expired",
                                value=report.expired_leases)
        yield GaugeMetricFamily("pgtaskd_oldest_pending_age_seconds",
                                "How long the oldest due PENDING task has waited",
                                value=report.oldest_pending_age)
        yield GaugeMetricFamily("pgtaskd_live_children", "Worker children alive",
                                value=report.children.live)
        yield GaugeMetricFamily("pgtaskd_expected_children", "Worker children configured",
                                value=report.children.expected)
        yield GaugeMetricFamily("pgtaskd_database_up", "1 if the last health check reached PostgreSQL",
                                value=1 if report.database_ok else 0)


def make_handler(health: HealthChecker, multiproc_dir: str):
    class Handler(BaseHTTPRequestHandler):
        server_version = "pgtaskd"

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                registry = CollectorRegistry()
                MultiProcessCollector(registry, path=multiproc_dir)
                registry.register(QueueCollector(health))
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/healthz":
                body = health.latest().as_json()
                code = 200 if body["status"] == "ok" else 503
                self._send(code, "application/json", json.dumps(body).encode() + b"\n")
            else:
                self._send(404, "text/plain", b"not found: try /metrics or /healthz\n")

        def _send(self, code: int, content_type: str, body: bytes):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format, *args):
            pass  # scrapes every few seconds would drown the log

    return Handler


class MetricsServer:
    def __init__(self, address: tuple[str, int], health: HealthChecker, multiproc_dir: str):
        self.httpd = ThreadingHTTPServer(address, make_handler(health, multiproc_dir))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> None:
        self.thread.start()
        emit("http_listening", address=f"{self.httpd.server_address[0]}:{self.port}")

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
