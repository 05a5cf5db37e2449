"""How long the daemon's health check takes on a large queue (a bench, not a test).

    PGTASKD_DSN=postgresql://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python tests/bench_health.py [--pending 1000000] [--runs 15] [--keep]

In a scratch schema of that database (the bench's own, dropped at the end unless --keep, or
reused with --schema NAME): ``pending`` PENDING tasks over 8 types (nine in ten due within
the last hour, web-bench's fill), 200 RUNNING, and 20,000 due PENDING tasks of 20,000 types
no config names (the hostile rows the per-type gauges must fold into one series). Then it
runs HealthChecker.run_once, the daemon's health check as it runs every few seconds (for a
daemon whose pools run type0..type3, with a schedule on type4 and a limit on type5), and
prints each run's time and the median. The first run, which reads the catalog and warms the
cache, is left out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.cli import web_bench  # noqa: E402
from supervisor.cli.bench_database import _schema_dsn, scratch_schema  # noqa: E402
from supervisor.db import store  # noqa: E402
from supervisor.db.connect import connect  # noqa: E402
from supervisor.maintenance.health import ChildrenStatus, HealthChecker  # noqa: E402

HANDLED = frozenset(f"type{n}" for n in range(4))
KNOWN = HANDLED | {"type4", "type5"}
HOSTILE_TYPES = 20_000


def fill(dsn: str, pending: int) -> None:
    web_bench.fill(dsn, finished=0, pending=pending)
    with connect(dsn, connect_timeout=10) as conn:
        conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                     "SELECT 'junk-' || g, 'n', 'junk' || g, now() - interval '10 minutes' "
                     "FROM generate_series(1, %s) g", (HOSTILE_TYPES,))
        store.set_task_type_limit(conn, "type5", 4, updated_by="bench")
        conn.execute("VACUUM ANALYZE tasks")


def checker(dsn: str) -> HealthChecker:
    kwargs = dict(interval=5.0, max_pending_age=300.0, lease_grace=15.0,
                  children=lambda: ChildrenStatus(4, 4), task_types=HANDLED)
    try:
        return HealthChecker(dsn, known_types=KNOWN, **kwargs)
    except TypeError:  # a version before the per-type gauges
        return HealthChecker(dsn, **kwargs)


def measure(dsn: str, runs: int) -> list[float]:
    health = checker(dsn)
    times = []
    for _ in range(runs + 1):
        started = time.monotonic()
        health.run_once()
        times.append(1000 * (time.monotonic() - started))
    health._close()
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--schema")
    args = parser.parse_args()
    dsn = os.environ["PGTASKD_DSN"]
    if args.schema:
        times = measure(_schema_dsn(dsn, args.schema), args.runs)
    else:
        with scratch_schema(dsn, keep=args.keep) as bench_dsn:
            fill(bench_dsn, args.pending)
            times = measure(bench_dsn, args.runs)
    print("health check ms:", " ".join(f"{t:.1f}" for t in times))
    print(f"median {statistics.median(times):.1f} ms, min {min(times):.1f}, "
          f"max {max(times):.1f} ({args.runs} runs)")


if __name__ == "__main__":
    main()
