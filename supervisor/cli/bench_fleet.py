"""``pgtaskd bench-fleet``: throughput per added daemon, against one PostgreSQL.

For each batch size and each daemon count, a fleet of real daemons (``pgtaskd run``, each with
one pool of ``--processes`` no-op workers, as ``pgtaskd bench`` starts one) drains the same
``--tasks``, timed as the bench's drain is: from the start of one ``submit_many`` to the last
task COMPLETED. Every drain also reads, from /proc, the CPU spent by PostgreSQL's processes
when the server runs on this host: the daemons' own backends (claims, final writes, their
supervisors' services), the bench's submitting backend, and the server's background processes
(WAL writer, checkpointer, background writer, autovacuum). That sum per task is what one task
costs the primary, the figure that sizes a bigger one. The machine's busy share (/proc/stat)
says whether it was the database or the cores that ran out: on one host the daemons and the
server share them.

Runs are interleaved (each run goes through every batch size and daemon count in turn), so
that a noisy minute on a shared machine spreads over the curve instead of bending one point.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..db.connect import connect, describe_target
from ..db.session import database_dsn
from ..errors import OperationalError, UsageError
from .bench_daemon import BOOT_PATIENCE, BenchDaemon, cpu_seconds, measure_drain
from .bench_database import Options, scratch_schema

# What a bench daemon may hold (README, Connections: 8 + P, less the scheduler's, since it has
# no schedules): 7 + P. Counted in pg_stat_activity during a drain in batches of 10: 8 for
# P = 2 (the lease keeper's opens with the first renewal, which a no-op drain never needs).
SUPERVISOR_CONNECTIONS = 7
_COUNTS = re.compile(r"[0-9,]+/[0-9,]+")
# Gained less than this from doubling the daemons: the curve has flattened.
FLAT_GAIN = 0.10


@dataclass(frozen=True)
class FleetOptions:
    """What one ``pgtaskd bench-fleet`` measures."""

    tasks: int = 20_000
    daemons: tuple[int, ...] = (1, 2, 4, 8)
    processes: int = 2
    """Worker processes of each daemon."""
    batch_sizes: tuple[int, ...] = (1, 10)
    runs: int = 3
    as_json: bool = False

    def drain_options(self, batch_size: int) -> Options:
        return Options(tasks=self.tasks, processes=self.processes, batch_size=batch_size,
                       runs=1, latency_samples=0)

    def connections_needed(self) -> int:
        return max(self.daemons) * (SUPERVISOR_CONNECTIONS + self.processes)


class Fleet:
    """Daemons started together; what ``measure_drain`` asks of one daemon, of them all."""

    def __init__(self, dsn: str, count: int, options: Options, workdir: Path):
        self.daemons = [BenchDaemon(dsn, options, workdir, pool=f"fleet{n}")
                        for n in range(1, count + 1)]

    def __enter__(self) -> "Fleet":
        self._stack = contextlib.ExitStack()
        for daemon in self.daemons:
            self._stack.enter_context(daemon)
        return self

    def __exit__(self, *exc) -> None:
        for daemon in self.daemons:
            daemon.stop()
        self._stack.close()

    def wait_booted(self, conn) -> None:
        deadline = time.monotonic() + BOOT_PATIENCE
        while not all(daemon.booted(conn) for daemon in self.daemons):
            self.check()
            if time.monotonic() > deadline:
                raise OperationalError(f"{len(self.daemons)} daemons did not all boot within "
                                       f"{BOOT_PATIENCE:g} s")
            time.sleep(0.1)
        time.sleep(0.5)  # let every child settle into its idle wait

    def check(self) -> None:
        for daemon in self.daemons:
            daemon.check()

    def pids(self) -> dict[str, list[int]]:
        groups: dict[str, list[int]] = {"supervisor": [], "workers": []}
        for daemon in self.daemons:
            for kind, pids in daemon.pids().items():
                groups[kind] += pids
        return groups


# -- what the server spent besides the daemons' backends ----------------------------------------

def server_side_pids(conn) -> list[int]:
    """The bench's own backend (it submits) and the server's background processes.

    Autovacuum workers that start and end within a drain are missed, and the background
    processes serve every database of the server: on a shared server this is an upper bound
    for them and a lower one for autovacuum."""
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE pid = pg_backend_pid() "
                        "OR backend_type <> 'client backend'").fetchall()
    return [pid for (pid,) in rows if cpu_seconds(pid) is not None]


def _cpu_of(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) or 0 for pid in pids)


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _daemons(count: int) -> str:
    return f"{count} daemon{'s' if count > 1 else ''}"


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def measure_point(dsn: str, count: int, batch_size: int, options: FleetOptions, workdir: Path,
                  progress) -> dict:
    drain_options = options.drain_options(batch_size)
    with Fleet(dsn, count, drain_options, workdir) as fleet, connect(dsn) as conn:
        fleet_name = _daemons(count)
        progress(f"boot {fleet_name}, batch {batch_size}")
        fleet.wait_booted(conn)
        others = server_side_pids(conn)
        others_before = _cpu_of(others)
        busy_before, total_before = _machine_ticks()
        drain = measure_drain(fleet, conn, drain_options,
                              lambda text: progress(f"{text} ({fleet_name}, "
                                                    f"batch {batch_size})"))
        busy_after, total_after = _machine_ticks()
        others_us = (_cpu_of(others) - others_before) / options.tasks * 1e6
    rate = drain["tasks_per_second"]
    backends_us = drain["cpu_us_per_task"].get("postgres")
    postgres_us = None if backends_us is None else backends_us + others_us
    return {"daemons": count, "batch_size": batch_size, "tasks_per_second": rate,
            "postgres_backends_us_per_task": backends_us,
            "postgres_us_per_task": postgres_us,
            # CPU-seconds a second: how many cores the server kept busy during the drain.
            "postgres_cores": None if postgres_us is None else postgres_us * rate / 1e6,
            "machine_busy_percent": 100 * (busy_after - busy_before)
            / max(1, total_after - total_before),
            "cpu_us_per_task": drain["cpu_us_per_task"]}


# -- the report -------------------------------------------------------------------------------

def summarize(options: FleetOptions, points: list[dict]) -> list[dict]:
    """The median of each (batch size, daemon count) over the runs."""
    curve = []
    for batch_size in options.batch_sizes:
        for count in options.daemons:
            runs = [p for p in points if p["batch_size"] == batch_size and p["daemons"] == count]

            def median(key):
                values = [p[key] for p in runs if p[key] is not None]
                return statistics.median(values) if values else None

            curve.append({"batch_size": batch_size, "daemons": count,
                          "workers": count * options.processes,
                          **{key: median(key) for key in (
                              "tasks_per_second", "postgres_backends_us_per_task",
                              "postgres_us_per_task", "postgres_cores",
                              "machine_busy_percent")},
                          "runs": [round(p["tasks_per_second"]) for p in runs]})
    return curve


def saturation(curve: list[dict], batch_size: int) -> dict | None:
    """The first point after which adding daemons gained less than FLAT_GAIN."""
    points = [p for p in curve if p["batch_size"] == batch_size]
    for before, after in zip(points, points[1:]):
        gain = after["tasks_per_second"] / before["tasks_per_second"] - 1
        if gain < FLAT_GAIN:
            return {"daemons": before["daemons"], "next": after["daemons"], "gain": gain,
                    "point": before}
    return None


def render(options: FleetOptions, target: str, curve: list[dict]) -> str:
    def number(value, pattern):
        return "-" if value is None else format(value, pattern)

    lines = [f"pgtaskd bench-fleet: {options.tasks:,} no-op tasks, {options.processes} worker "
             f"processes a daemon, {options.runs} runs (medians), on {target}, "
             f"{_cores()} cores here", "",
             f"{'batch':>5} {'daemons':>7} {'workers':>7} {'drained/s':>10} {'x 1 daemon':>10} "
             f"{'pg us/task':>10} {'backends':>8} {'pg cores':>8} {'machine':>7}   runs"]
    for batch_size in options.batch_sizes:
        points = [p for p in curve if p["batch_size"] == batch_size]
        first = points[0]["tasks_per_second"]
        for p in points:
            lines.append(
                f"{batch_size:>5} {p['daemons']:>7} {p['workers']:>7} "
                f"{p['tasks_per_second']:>10,.0f} {p['tasks_per_second'] / first:>10.2f} "
                f"{number(p['postgres_us_per_task'], '>10,.0f')} "
                f"{number(p['postgres_backends_us_per_task'], '>8,.0f')} "
                f"{number(p['postgres_cores'], '>8.2f')} "
                f"{p['machine_busy_percent']:>6.0f}%   "
                + "  ".join(f"{rate:,}" for rate in p["runs"]))
    lines.append("")
    lines.append("pg us/task: CPU of every PostgreSQL process per task (the daemons' backends, "
                 "the submitting one, the background processes); backends: the daemons' alone; "
                 "pg cores: CPU-seconds a second; machine: busy share of every core")
    for batch_size in options.batch_sizes:
        found = saturation(curve, batch_size)
        if found is None:
            lines.append(f"batch {batch_size}: still gaining {100 * FLAT_GAIN:.0f}% or more at "
                         f"every step up to {_daemons(options.daemons[-1])}")
            continue
        point = found["point"]
        lines.append(
            f"batch {batch_size}: flat from {_daemons(found['daemons'])} "
            f"({point['workers']} workers, {point['tasks_per_second']:,.0f}/s): "
            f"{found['daemons']} -> {found['next']} gained {100 * found['gain']:+.0f}%; "
            f"PostgreSQL then used {number(point['postgres_cores'], '.2f')} cores, "
            f"the machine {point['machine_busy_percent']:.0f}%")
    return "\n".join(lines)


def check_connections(dsn: str, options: FleetOptions) -> None:
    with connect(dsn) as conn:
        limit, reserved, used = conn.execute(
            "SELECT current_setting('max_connections')::int, "
            "current_setting('superuser_reserved_connections')::int, "
            "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        ).fetchone()
    free = limit - reserved - used
    needed = options.connections_needed()
    if needed > free:
        raise UsageError(f"--daemons: {max(options.daemons)} daemons may hold {needed} "
                         f"connections, and the server has {free} free (max_connections "
                         f"{limit}, {used} in use)")


def run_fleet_bench(config: Config, options: FleetOptions) -> int:
    points: list[dict] = []
    last_phase = [""]

    def progress(text: str) -> None:
        run = len(points) // (len(options.daemons) * len(options.batch_sizes)) + 1
        phase = _COUNTS.sub("", text)  # a line per phase, not per progress report
        if phase != last_phase[0]:
            last_phase[0] = phase
            print(f"run {run}/{options.runs}: {text}", file=sys.stderr, flush=True)

    with database_dsn(config) as dsn, tempfile.TemporaryDirectory(prefix="pgtaskd-fleet-") as tmp:
        target = describe_target(dsn)
        check_connections(dsn, options)
        with scratch_schema(dsn) as bench_dsn:
            for _ in range(options.runs):
                for batch_size in options.batch_sizes:
                    for count in options.daemons:
                        points.append(measure_point(bench_dsn, count, batch_size, options,
                                                    Path(tmp), progress))
    curve = summarize(options, points)
    if options.as_json:
        print(json.dumps({"options": options.__dict__, "database": target, "cores": _cores(),
                          "runs": points, "median": curve}, indent=2))
    else:
        print(render(options, target, curve))
    return 0
