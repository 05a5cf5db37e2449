"""``pgtaskd web-bench``: how long the console's server takes for each page on a large table.

In a schema of its own on the configured database (the bench's scratch schema), it fills
finished, pending and a few running tasks, vacuums and analyzes them as autovacuum would,
rolls up the minutes as a daemon would, starts ``pgtaskd web`` on a free port of 127.0.0.1,
and requests each page in turn. The server's time is the answer's ``Server-Timing`` header
(from the request's arrival to its answer's start, database included); the client's time
over loopback is printed beside it.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import yaml

from ..config import Config
from ..db import queue_figures, store
from ..db.connect import connect
from ..db.session import database_dsn
from ..errors import EXIT_OK, OperationalError
from .bench_database import scratch_schema
from .output import print_json

FILL_CHUNK = 250_000
TYPES = 8
RUNNING = 200
_TIMING = re.compile(r"app;dur=([\d.]+)")


def _progress(text: str) -> None:
    print(f"web-bench: {text}", file=sys.stderr, flush=True)


def fill(dsn: str, finished: int, pending: int) -> None:
    with connect(dsn, connect_timeout=10) as conn:
        conn.execute("SET statement_timeout = 0")
        for kind, total in (("finished", finished), ("pending", pending),
                            ("running", RUNNING)):
            for first in range(1, total + 1, FILL_CHUNK):
                count = min(FILL_CHUNK, total - first + 1)
                _progress(f"{kind} {first - 1 + count:,}/{total:,}")
                store.fill_bench_tasks(conn, kind=kind, first=first, count=count, types=TYPES)
        _progress("vacuum and analyze")
        conn.execute("VACUUM ANALYZE tasks")
        store.rollup_minutes(conn, cap=queue_figures.COUNT_CAP, catch_up=60, max_types=200)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_console(dsn: str, folder: Path):
    port = _free_port()
    config = folder / "web.yaml"
    config.write_text(yaml.safe_dump({"database": {"dsn": dsn}, "metrics": {"listen": ""},
                                      "web": {"listen": f"127.0.0.1:{port}"}}))
    env = {k: v for k, v in os.environ.items() if k not in ("PGTASKD_DSN", "PGTASKD_CONFIG")}
    log = open(folder / "web.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "web", "-c", str(config)],
                            stdout=subprocess.DEVNULL, stderr=log, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(port, "/login")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise OperationalError("web-bench: the console did not start: " +
                                           (folder / "web.log").read_text()[-500:]) from None
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _get(port: int, path: str, headers: dict | None = None) -> tuple[int, float, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        body = response.read().decode("utf-8", "replace")
        timing = _TIMING.search(response.getheader("server-timing") or "")
        return response.status, float(timing[1]) if timing else float("nan"), body
    finally:
        connection.close()


def pages(port: int, dsn: str) -> list[tuple[str, str, dict]]:
    """The pages to time: (label, path, headers)."""
    with connect(dsn) as conn:
        # A failed task's page shows its error; with no finished tasks filled (--finished 0)
        # there is none, and a running one (the fill always makes some) is timed instead.
        failed = (conn.execute("SELECT id FROM tasks WHERE status = 'FAILED' LIMIT 1").fetchone()
                  or conn.execute("SELECT id FROM tasks LIMIT 1").fetchone())
    _, _, first_page = _get(port, "/tasks?status=PENDING&type=type1")
    after = re.search(r'id="next-page" rel="next" href="/tasks\?([^"]+)"', first_page)
    second = "/tasks?" + (after[1].replace("&amp;", "&") if after else "status=PENDING")
    task = "/tasks/" + urllib.parse.quote(failed[0] if failed else "none", safe="")
    live = {"X-Console-Live": "1"}
    return [
        ("overview", "/", {}),
        ("overview, live update", "/", live),
        ("tasks PENDING, all types", "/tasks", {}),
        ("tasks PENDING, one type", "/tasks?status=PENDING&type=type1", {}),
        ("tasks PENDING, one type, page 2", second, {}),
        ("tasks PENDING, due later", "/tasks?status=PENDING&type=type0", {}),
        ("tasks RUNNING", "/tasks?status=RUNNING", {}),
        ("tasks FAILED", "/tasks?status=FAILED", {}),
        ("tasks FAILED, one type", "/tasks?status=FAILED&type=type3", {}),
        ("tasks COMPLETED, error text", "/tasks?status=COMPLETED&error=upstream", {}),
        ("tasks FAILED, id prefix", "/tasks?status=FAILED&id=finished-9", {}),
        ("a task", task, {}),
        ("schedules", "/schedules", {}),
        ("limits", "/limits", {}),
        ("pauses", "/pauses", {}),
    ]


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def measure(port: int, targets, requests: int) -> list[dict]:
    results = []
    for label, path, headers in targets:
        server, client = [], []
        for _ in range(requests):
            started = time.perf_counter()
            status, spent, _ = _get(port, path, headers)
            client.append((time.perf_counter() - started) * 1000)
            if status != 200:
                raise OperationalError(f"web-bench: {path} answered {status}")
            server.append(spent)
        results.append({"page": label, "path": path, "requests": requests,
                        "server_p50_ms": statistics.median(server),
                        "server_p95_ms": _percentile(server, 0.95),
                        "server_max_ms": max(server),
                        "client_p50_ms": statistics.median(client)})
        _progress(f"{label}: p95 {results[-1]['server_p95_ms']:.1f} ms")
    return results


def run_web_bench(config: Config, *, finished: int, pending: int, requests: int,
                  keep: bool, as_json: bool = False) -> int:
    with database_dsn(config) as dsn:
        with contextlib.ExitStack() as stack:
            schema_dsn = stack.enter_context(scratch_schema(dsn, keep=keep))
            started = time.monotonic()
            fill(schema_dsn, finished, pending)
            filled = time.monotonic() - started
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pgtaskd-wb-")))
            port = stack.enter_context(running_console(schema_dsn, folder))
            for _, path, headers in pages(port, schema_dsn):  # warm the caches once
                _get(port, path, headers)
            results = measure(port, pages(port, schema_dsn), requests)
    if as_json:
        print_json({"finished": finished, "pending": pending, "fill_seconds": filled,
                    "pages": results})
        return EXIT_OK
    print(f"{finished:,} finished and {pending:,} pending tasks ({RUNNING} running, "
          f"{TYPES} types; filled in {filled:.0f} s), {requests} requests a page")
    print(f"{'page':36} {'server p50':>10} {'p95':>8} {'max':>8} {'client p50':>11}  (ms)")
    for row in results:
        print(f"{row['page']:36} {row['server_p50_ms']:10.1f} {row['server_p95_ms']:8.1f} "
              f"{row['server_max_ms']:8.1f} {row['client_p50_ms']:11.1f}")
    return EXIT_OK
