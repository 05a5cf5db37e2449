"""``pgtaskd bench``: the yardstick for throughput, pickup latency and memory.

Every run happens in a schema of its own on the configured database (through
``search_path``), created, migrated and dropped by the run, so it never touches the
operator's tasks. Each run measures, in order:

  submit       ``Client.submit`` one task per call, on one connection
  submit_many  ``Client.submit_many`` of all the tasks at once
  ceiling      the worker's own claim-and-complete statement driven by the same number of
               processes and batch size, with no daemon around it: what the database allows
  drain        a real daemon (``pgtaskd run``) with one pool of no-op workers: the time from
               the start of one ``submit_many`` to the last task COMPLETED
  latency      with the daemon's workers idle, one task submitted at a random moment, and the
               time until its handler starts (reported back over UDP on 127.0.0.1)

It also reads the daemon's memory (RSS) once it has booted and after the drain, and the CPU
time each kind of process spent per drained task. Machines are shared and noisy: every run
is printed and the median is what counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..config import DSN_ENV, Config
from ..db import store
from ..db.connect import connect, describe_target
from ..db.migrate import migrate
from ..db.session import database_dsn
from ..errors import OperationalError

BOOT_PATIENCE = 60.0
DRAIN_PATIENCE = 600.0
SAMPLE_TIMEOUT = 5.0
POLL = 0.02
PROGRESS_EVERY = 0.5
CHUNK = 10_000
_SAMPLE = struct.Struct("!Id")


def noop(task) -> None:
    """The drain's handler: all the cost measured is pgtaskd's own."""


def pickup(task) -> None:
    """The latency handler: report, first thing, when it started (CLOCK_MONOTONIC is one
    clock for every process of the host)."""
    started = time.monotonic()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(_SAMPLE.pack(task.payload["sample"], started),
                    ("127.0.0.1", task.payload["port"]))


@dataclass(frozen=True)
class Options:
    tasks: int = 5000
    processes: int = 2
    batch_size: int = 1
    runs: int = 3
    latency_samples: int = 200
    limit: int | None = None
    """A global concurrency limit on the drained type (limits.<type>), to measure its cost."""
    as_json: bool = False


# -- one run ---------------------------------------------------------------------------------

def _schema_dsn(dsn: str, schema: str) -> str:
    params = conninfo_to_dict(dsn)
    params["options"] = (params.get("options", "") + f" -csearch_path={schema}").strip()
    return make_conninfo(**params)


@contextlib.contextmanager
def scratch_schema(dsn: str):
    schema = f"pgtaskd_bench_{uuid.uuid4().hex[:8]}"
    with connect(dsn) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        bench_dsn = _schema_dsn(dsn, schema)
        with connect(bench_dsn) as conn:
            migrate(conn)
        yield bench_dsn
    finally:
        with connect(dsn) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def _tasks(count: int, task_type: str = "noop"):
    return ({"task_type": task_type, "payload": {"n": n}} for n in range(count))


def measure_submit(dsn: str, count: int, progress) -> float:
    from ..client import Client

    with connect(dsn) as conn:
        client = Client(conn)
        started = time.monotonic()
        for n in range(count):
            client.submit("noop", {"n": n})
            if n % 500 == 0:
                progress(f"submit {n:,}/{count:,}")
        elapsed = time.monotonic() - started
        conn.execute("TRUNCATE tasks")
    return count / elapsed


def measure_submit_many(dsn: str, count: int, progress) -> float:
    from ..client import Client

    with connect(dsn) as conn:
        progress(f"submit_many {count:,}")
        started = time.monotonic()
        for offset in range(0, count, CHUNK):
            Client(conn).submit_many(_tasks(min(CHUNK, count - offset)))
        elapsed = time.monotonic() - started
        conn.execute("TRUNCATE tasks")
    return count / elapsed


def _left(conn) -> int:
    return conn.execute("SELECT count(*) FROM tasks WHERE status IN ('PENDING', 'RUNNING')"
                        ).fetchone()[0]


def _any_left(conn) -> bool:
    """Cheap enough to ask every POLL without taking CPU from what is measured (a count
    over thousands of rows every few milliseconds does)."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'PENDING') "
                        "OR EXISTS (SELECT 1 FROM tasks WHERE status = 'RUNNING')").fetchone()[0]


def measure_ceiling(dsn: str, options: Options, progress) -> float:
    """The daemon's claim-and-complete statement from bare processes: the database's limit."""
    from ..client import Client

    with connect(dsn) as conn:
        for offset in range(0, options.tasks, CHUNK):
            Client(conn).submit_many(_tasks(min(CHUNK, options.tasks - offset)))
        progress(f"ceiling: {options.processes} processes")
        workers = [subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli.bench", "ceiling", str(options.batch_size)],
            env={**os.environ, DSN_ENV: dsn}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True) for _ in range(options.processes)]
        try:
            for worker in workers:
                if worker.stdout.readline().strip() != "ready":
                    raise OperationalError("a ceiling process failed to start")
            started = time.monotonic()
            for worker in workers:
                worker.stdin.write("go\n")
                worker.stdin.flush()
            done = sum(int(worker.stdout.readline() or 0) for worker in workers)
            elapsed = time.monotonic() - started
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                worker.wait()
        if done != options.tasks or _left(conn):
            raise OperationalError(f"the ceiling processes completed {done} of {options.tasks}")
        conn.execute("TRUNCATE tasks")
    return options.tasks / elapsed


def ceiling_worker(batch_size: int) -> int:
    """One bare claim-and-complete loop (``python -m supervisor.cli.bench ceiling N``)."""
    from ..worker.pools import use_generic_plans

    worker_id = f"ceiling:{os.getpid()}"
    with connect(os.environ[DSN_ENV]) as conn:
        use_generic_plans(conn)
        print("ready", flush=True)
        sys.stdin.readline()
        done: list[store.Claim] = []
        completed = 0
        while True:
            landed, rows = store.complete_and_claim(conn, done, worker_id=worker_id,
                                                    task_types=["noop"], lease_seconds=30,
                                                    limit=batch_size)
            completed += len(landed)
            if not rows:
                break
            done = [store.Claim(row["id"], worker_id, row["lease_token"]) for row in rows]
    print(completed, flush=True)
    return 0


class BenchDaemon:
    """``pgtaskd run`` in a subprocess, on the bench schema, with one pool of no-op workers."""

    def __init__(self, dsn: str, options: Options, workdir: Path):
        self.dsn = dsn
        self.options = options
        self.config_path = workdir / f"bench-{uuid.uuid4().hex[:8]}.yaml"
        self.config_path.write_text(json.dumps({
            "handlers": {"path": str(workdir), "types": {"noop": "supervisor.cli.bench:noop",
                                                         "pickup": "supervisor.cli.bench:pickup"}},
            "pools": {"bench": {"processes": options.processes,
                                "batch_size": options.batch_size}},
            "metrics": {"listen": ""},
            "shutdown_timeout": 10,
        }))
        self.log_path = workdir / "daemon.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "BenchDaemon":
        self.log = open(self.log_path, "a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "run", "-c", str(self.config_path)],
            env={**os.environ, DSN_ENV: self.dsn}, stdout=subprocess.DEVNULL, stderr=self.log,
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

    def wait_booted(self, conn) -> None:
        """Every worker holds a connection named ``pgtaskd bench#N`` once it booted."""
        deadline = time.monotonic() + BOOT_PATIENCE
        while time.monotonic() < deadline:
            booted = conn.execute(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                "WHERE application_name LIKE 'pgtaskd bench#%%' AND datname = current_database()"
            ).fetchone()[0]
            if booted >= self.options.processes:
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


def _cpu_seconds(pid: int) -> float | None:
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
    backends = [pid for (pid,) in rows if _cpu_seconds(pid) is not None]
    if backends:
        groups["postgres"] = backends
    return groups


def _memory(daemon: BenchDaemon) -> dict[str, float | None]:
    pids = daemon.pids()
    workers = [r for r in (_rss_mib(p) for p in pids["workers"]) if r is not None]
    return {"supervisor_mib": _rss_mib(pids["supervisor"][0]),
            "worker_max_mib": max(workers) if workers else None}


def measure_drain(daemon: BenchDaemon, conn, options: Options, progress) -> dict:
    from ..client import Client

    groups = _process_groups(daemon, conn)
    cpu_before = {kind: sum(_cpu_seconds(p) or 0 for p in pids) for kind, pids in groups.items()}
    started = time.monotonic()
    for offset in range(0, options.tasks, CHUNK):
        Client(conn).submit_many(_tasks(min(CHUNK, options.tasks - offset)))
    deadline = started + DRAIN_PATIENCE
    next_report = started
    while _any_left(conn):
        daemon.check()
        now = time.monotonic()
        if now > deadline:
            raise OperationalError(f"{_left(conn)} tasks still not done after "
                                   f"{DRAIN_PATIENCE:g} s")
        if now >= next_report:
            progress(f"drain {options.tasks - _left(conn):,}/{options.tasks:,}")
            next_report = now + PROGRESS_EVERY
        time.sleep(POLL)
    elapsed = time.monotonic() - started
    cpu = {kind: round((sum(_cpu_seconds(p) or 0 for p in pids) - cpu_before[kind])
                       / options.tasks * 1e6, 1) for kind, pids in groups.items()}
    counts = store.count_by_status(conn)
    if counts.get("COMPLETED", 0) != options.tasks:
        raise OperationalError(f"drain ended with {counts}, not {options.tasks} COMPLETED")
    conn.execute("TRUNCATE tasks")
    return {"tasks_per_second": options.tasks / elapsed, "cpu_us_per_task": cpu}


def measure_latency(daemon: BenchDaemon, conn, samples: int, progress) -> dict:
    from ..client import Client

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
    conn.execute("TRUNCATE tasks")
    return {"p50_ms": _percentile(latencies, 50), "p95_ms": _percentile(latencies, 95),
            "p99_ms": _percentile(latencies, 99), "samples": len(latencies)}


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * len(ordered) + 0.5) - 1))
    return round(ordered[index], 3)


def run_once(dsn: str, options: Options, workdir: Path, progress) -> dict:
    with scratch_schema(dsn) as bench_dsn:
        if options.limit:
            # Set before the ceiling, so that the bare SQL pays for the slots as the daemon
            # does.
            with connect(bench_dsn) as conn:
                store.set_task_type_limit(conn, "noop", options.limit, updated_by="bench")
        result = {"submit_per_second": measure_submit(bench_dsn, min(options.tasks, 5000),
                                                      progress),
                  "submit_many_per_second": measure_submit_many(bench_dsn, options.tasks,
                                                                progress),
                  "ceiling_per_second": measure_ceiling(bench_dsn, options, progress)}
        with BenchDaemon(bench_dsn, options, workdir) as daemon, connect(bench_dsn) as conn:
            progress("booting the daemon")
            daemon.wait_booted(conn)
            result["memory_idle"] = _memory(daemon)
            drain = measure_drain(daemon, conn, options, progress)
            result["drain_per_second"] = drain["tasks_per_second"]
            result["cpu_us_per_task"] = drain["cpu_us_per_task"]
            result["memory_after_drain"] = _memory(daemon)
            if options.latency_samples:
                time.sleep(0.5)  # idle again: every worker waits for a wake-up
                result["latency"] = measure_latency(daemon, conn, options.latency_samples,
                                                    progress)
            result["memory_after"] = _memory(daemon)
    return result


# -- the report -------------------------------------------------------------------------------

def summarize(runs: list[dict]) -> dict:
    def median(key):
        return statistics.median(run[key] for run in runs)

    summary = {key: median(key) for key in
               ("submit_per_second", "submit_many_per_second", "ceiling_per_second",
                "drain_per_second")}
    summary["drain_percent_of_ceiling"] = 100 * summary["drain_per_second"] / \
        summary["ceiling_per_second"]
    if all("latency" in run for run in runs):
        summary["latency"] = {key: statistics.median(run["latency"][key] for run in runs)
                              for key in ("p50_ms", "p95_ms", "p99_ms")}
    memories = [run[key] for run in runs for key in ("memory_idle", "memory_after")]
    summary["memory_max_mib"] = {
        key: max((m[key] for m in memories if m[key] is not None), default=None)
        for key in ("supervisor_mib", "worker_max_mib")}
    kinds = {kind for run in runs for kind in run["cpu_us_per_task"]}
    summary["cpu_us_per_task"] = {
        kind: statistics.median(run["cpu_us_per_task"].get(kind, 0) for run in runs)
        for kind in sorted(kinds)}
    return summary


def render(options: Options, target: str, runs: list[dict], summary: dict) -> str:
    def rates(key):
        return "  ".join(f"{run[key]:>8,.0f}" for run in runs)

    ceiling = summary["ceiling_per_second"]
    lines = [f"pgtaskd bench: {options.tasks:,} tasks, {options.processes} processes, "
             f"batch size {options.batch_size}, {options.runs} runs, on {target}"
             + (f", no-op tasks limited to {options.limit} at once" if options.limit else ""),
             "",
             f"{'measurement':<34}{'median':>12}  {'% of ceiling':>12}   runs"]
    for label, key, pct in (("submit, one per call", "submit_per_second", False),
                            ("submit_many", "submit_many_per_second", False),
                            ("ceiling: claim+complete SQL", "ceiling_per_second", True),
                            ("drain, real daemon", "drain_per_second", True)):
        share = f"{100 * summary[key] / ceiling:>11.0f}%" if pct else " " * 12
        lines.append(f"{label:<34}{summary[key]:>10,.0f}/s  {share}   {rates(key)}")
    if "latency" in summary:
        latency = summary["latency"]
        per_run = "  ".join(f"{r['latency']['p50_ms']:.2f}/{r['latency']['p95_ms']:.2f}/"
                            f"{r['latency']['p99_ms']:.2f}" for r in runs)
        lines.append(f"{'pickup latency p50/p95/p99 (ms)':<34}"
                     f"{latency['p50_ms']:>5.2f}/{latency['p95_ms']:.2f}/{latency['p99_ms']:.2f}"
                     f"{'':>12}   {per_run}  ({runs[0]['latency']['samples']} samples a run)")
    memory = summary["memory_max_mib"]
    lines.append(f"{'memory, largest RSS (MiB)':<34}supervisor {memory['supervisor_mib'] or 0:.1f}, "
                 f"worker {memory['worker_max_mib'] or 0:.1f} (at idle and after the runs)")
    cpu = ", ".join(f"{kind} {value:,.0f}" for kind, value in summary["cpu_us_per_task"].items())
    lines.append(f"{'CPU per drained task (us)':<34}{cpu}")
    return "\n".join(lines)


def run_bench(config: Config, options: Options) -> int:
    interactive = sys.stderr.isatty()
    runs: list[dict] = []
    last_phase = [""]

    def progress(text: str) -> None:
        """One line on a terminal, rewritten in place; elsewhere a line per phase."""
        line = f"run {len(runs) + 1}/{options.runs}: {text}"
        if interactive:
            sys.stderr.write(f"\r\033[K{line}")
            sys.stderr.flush()
        elif text.split()[0] != last_phase[0]:
            last_phase[0] = text.split()[0]
            print(line, file=sys.stderr, flush=True)

    with database_dsn(config) as dsn, tempfile.TemporaryDirectory(prefix="pgtaskd-bench-") as tmp:
        target = describe_target(dsn)
        for _ in range(options.runs):
            runs.append(run_once(dsn, options, Path(tmp), progress))
    if interactive:
        sys.stderr.write("\r\033[K")
    summary = summarize(runs)
    if options.as_json:
        print(json.dumps({"options": options.__dict__, "database": target, "runs": runs,
                          "median": summary}, indent=2))
    else:
        print(render(options, target, runs, summary))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["ceiling"]:
        sys.exit(ceiling_worker(int(sys.argv[2])))
    sys.exit(f"usage: {sys.argv[0]} ceiling BATCH_SIZE (started by pgtaskd bench)")
