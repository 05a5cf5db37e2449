"""The bench's real daemon and what is measured through it.

``BenchDaemon`` runs ``pgtaskd run`` in a subprocess on the bench schema, with one pool whose
handlers are ``noop`` and ``pickup`` below. Through it: the drain (one ``submit_many`` to the
last task COMPLETED, with the CPU each kind of process spent), the pickup latency of idle
workers (reported back by the handler over UDP on 127.0.0.1), and the memory (RSS) read
from /proc.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

from ..client import Client
from ..config import DSN_ENV
from ..db import store
from ..db.connect import worker_application_name
from ..errors import OperationalError
from .bench_database import CHUNK, Options, any_tasks_left, noop_tasks, tasks_left

BOOT_PATIENCE = 60.0
DRAIN_PATIENCE = 600.0
SAMPLE_TIMEOUT = 5.0
POLL = 0.02
PROGRESS_EVERY = 0.5
_SAMPLE = struct.Struct("!Id")


# How long the drained handlers below wait, in milliseconds (set by BenchDaemon; inherited by
# the daemon's children with the rest of its environment).
WORK_MS_ENV = "PGTASKD_BENCH_WORK_MS"


def noop(task) -> None:
    """The drain's handler: all the cost measured is pgtaskd's own."""


def waits(task) -> None:
    """The drain's handler for --work-ms: blocks as a plain function waiting on I/O does."""
    time.sleep(float(os.environ.get(WORK_MS_ENV, 0)) / 1000)


async def waits_async(task) -> None:
    """The drain's handler for --work-ms --async: waits without holding the event loop."""
    await asyncio.sleep(float(os.environ.get(WORK_MS_ENV, 0)) / 1000)


def pickup(task) -> None:
    """The latency handler: report, first thing, when it started (CLOCK_MONOTONIC is one
    clock for every process of the host)."""
    started = time.monotonic()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(_SAMPLE.pack(task.payload["sample"], started),
                    ("127.0.0.1", task.payload["port"]))


class BenchDaemon:
    """``pgtaskd run`` in a subprocess, on the bench schema, with one pool of no-op workers."""

    def __init__(self, dsn: str, options: Options, workdir: Path, *, pool: str = "bench"):
        self.dsn = dsn
        self.options = options
        # Its workers' connections are named "pgtaskd <pool>#<slot>": a pool name per daemon
        # tells the daemons of a fleet apart in pg_stat_activity.
        self.pool = pool
        self.config_path = workdir / f"{pool}-{uuid.uuid4().hex[:8]}.yaml"
        drained = "waits_async" if options.async_handler else \
            ("waits" if options.work_ms else "noop")
        handlers = {"noop": f"supervisor.cli.bench_daemon:{drained}",
                    "pickup": "supervisor.cli.bench_daemon:pickup"}
        self.config_path.write_text(json.dumps({
            "handlers": {"path": str(workdir), "types": handlers},
            "pools": {pool: {"processes": options.processes,
                                "batch_size": options.batch_size,
                                "concurrency": options.concurrency}},
            "metrics": {"listen": ""},
            "shutdown_timeout": 10,
        }))
        self.log_path = workdir / f"{pool}.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "BenchDaemon":
        self.log = open(self.log_path, "a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "run", "-c", str(self.config_path)],
            env={**os.environ, DSN_ENV: self.dsn, WORK_MS_ENV: str(self.options.work_ms)},
            stdout=subprocess.DEVNULL, stderr=self.log,
            start_new_session=True)
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()

    def check(self) -> None:
        if self.process.poll() is not None:
            raise OperationalError(f"the bench daemon exited ({self.process.returncode}); "
                                   f"see {self.log_path}")

    def booted(self, conn) -> bool:
        """Every worker holds a connection named after its worker id once it booted
        (worker_application_name): host, pid, pool and slot."""
        prefixes = [_like_prefix(worker_application_name(f"{socket.gethostname()}:{pid}:"))
                    for pid in _children_of(self.process.pid)]
        return conn.execute(
            "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
            "WHERE application_name LIKE ANY(%s) AND datname = current_database()",
            (prefixes,)).fetchone()[0] >= self.options.processes

    def stop(self) -> None:
        """Ask it to stop, without waiting (a fleet asks all its daemons first)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_booted(self, conn) -> None:
        deadline = time.monotonic() + BOOT_PATIENCE
        while time.monotonic() < deadline:
            if self.booted(conn):
                # Let the children settle into their idle wait.
                time.sleep(0.5)
                return
            self.check()
            time.sleep(0.05)
        raise OperationalError(f"{self.options.processes} workers did not boot within "
                               f"{BOOT_PATIENCE:g} s")

    def pids(self) -> dict[str, list[int]]:
        children = _children_of(self.process.pid)
        return {"supervisor": [self.process.pid], "workers": children}


def _like_prefix(text: str) -> str:
    """A LIKE pattern for what starts with ``text`` (a host name may hold an underscore)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _process_groups(daemon: BenchDaemon, conn) -> dict[str, list[int]]:
    groups = daemon.pids()
    # The database's backends for this daemon, when the server runs on this host.
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name LIKE 'pgtaskd %%'").fetchall()
    backends = [pid for (pid,) in rows if cpu_seconds(pid) is not None]
    if backends:
        groups["postgres"] = backends
    return groups


def daemon_memory(daemon: BenchDaemon) -> dict[str, float | None]:
    pids = daemon.pids()
    workers = [r for r in (_rss_mib(p) for p in pids["workers"]) if r is not None]
    return {"supervisor_mib": _rss_mib(pids["supervisor"][0]),
            "worker_max_mib": max(workers) if workers else None}


def _cpu_by_pid(groups: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    return {kind: {pid: cpu_seconds(pid) or 0 for pid in pids} for kind, pids in groups.items()}


def measure_drain(daemon: BenchDaemon, conn, options: Options, progress) -> dict:
    cpu_before = _cpu_by_pid(_process_groups(daemon, conn))
    started = time.monotonic()
    for offset in range(0, options.tasks, CHUNK):
        Client(conn).submit_many(noop_tasks(min(CHUNK, options.tasks - offset)))
    deadline = started + DRAIN_PATIENCE
    next_report = started
    while any_tasks_left(conn):
        daemon.check()
        now = time.monotonic()
        if now > deadline:
            raise OperationalError(f"{tasks_left(conn)} tasks still not done after "
                                   f"{DRAIN_PATIENCE:g} s")
        if now >= next_report:
            progress(f"drain {options.tasks - tasks_left(conn):,}/{options.tasks:,}")
            next_report = now + PROGRESS_EVERY
        time.sleep(POLL)
    elapsed = time.monotonic() - started
    # Read again, by pid: a process that appeared during the drain (a backend that replaced
    # another, a child restarted) spent all its CPU in it. One that went is not counted.
    cpu_after = _cpu_by_pid(_process_groups(daemon, conn))
    cpu = {kind: round(sum(now - cpu_before.get(kind, {}).get(pid, 0)
                           for pid, now in pids.items()) / options.tasks * 1e6, 1)
           for kind, pids in cpu_after.items()}
    counts = store.count_by_status(conn)
    if counts.get("COMPLETED", 0) != options.tasks:
        raise OperationalError(f"drain ended with {counts}, not {options.tasks} COMPLETED")
    conn.execute("TRUNCATE tasks, task_attempts")
    return {"tasks_per_second": options.tasks / elapsed, "cpu_us_per_task": cpu}


def measure_latency(daemon: BenchDaemon, conn, samples: int, progress) -> dict:
    client = Client(conn)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(SAMPLE_TIMEOUT)
        port = sock.getsockname()[1]
        latencies = []
        for sample in range(samples):
            time.sleep(random.uniform(0.02, 0.2))
            submitted = time.monotonic()
            client.submit("pickup", {"sample": sample, "port": port})
            while True:
                try:
                    number, started = _SAMPLE.unpack(sock.recv(64))
                except socket.timeout:
                    daemon.check()
                    raise OperationalError(f"no handler started within {SAMPLE_TIMEOUT:g} s "
                                           f"of sample {sample}") from None
                if number == sample:
                    break
            latencies.append((started - submitted) * 1000)
            if sample % 10 == 0:
                progress(f"latency {sample}/{samples}")
    conn.execute("TRUNCATE tasks, task_attempts")
    return {"p50_ms": _percentile(latencies, 50), "p95_ms": _percentile(latencies, 95),
            "p99_ms": _percentile(latencies, 99), "samples": len(latencies)}


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))
    return round(ordered[index], 3)
