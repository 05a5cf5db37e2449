"""``pgtaskd bench-fleet`` drains with fleets of real daemons and reports the curve, with what
PostgreSQL's processes spent per task. A smoke test on 300 tasks: the figures are for people."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg


def run_fleet_bench(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "bench-fleet", *args],
                          env={**os.environ, "PGTASKD_DSN": dsn}, capture_output=True, text=True,
                          timeout=300)


def bench_schemas(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT count(*) FROM pg_namespace "
                            "WHERE nspname LIKE 'pgtaskd_bench_%'").fetchone()[0]


def test_bench_fleet_drains_with_each_fleet_and_cleans_up(db_dsn):
    result = run_fleet_bench(db_dsn, "--daemons", "1,2", "--processes", "1", "--batch-size",
                             "1", "--tasks", "300", "--runs", "1", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    curve = report["median"]
    assert [(p["daemons"], p["workers"], p["batch_size"]) for p in curve] == [(1, 1, 1),
                                                                              (2, 2, 1)]
    for point in curve:
        assert point["tasks_per_second"] > 0
        # The test's server runs on this host: its processes' CPU is read from /proc.
        assert point["postgres_us_per_task"] >= point["postgres_backends_us_per_task"] > 0
        assert 0 < point["machine_busy_percent"] <= 100
    # Both daemons of the second fleet claimed: each one's workers spent CPU.
    assert report["runs"][1]["cpu_us_per_task"]["workers"] > 0
    assert "run 1/1: drain" in result.stderr
    assert bench_schemas(db_dsn) == 0
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0


def test_bench_fleet_prints_the_curve(db_dsn):
    result = run_fleet_bench(db_dsn, "--daemons", "1", "--processes", "1", "--batch-size",
                             "5", "--tasks", "100", "--runs", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "drained/s" in result.stdout and "pg us/task" in result.stdout, result.stdout
    assert "batch 5: still gaining" in result.stdout, result.stdout


def test_bench_fleet_refuses_bad_arguments_in_one_line(db_dsn):
    for args, named in ((["--daemons", "2,1"], "--daemons"),
                        (["--daemons", "1,x"], "--daemons"),
                        (["--batch-size", "0"], "--batch-size"),
                        (["--batch-size", "100000"], "--batch-size")):
        result = run_fleet_bench(db_dsn, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.strip().count("\n") == 0, result.stderr
        assert named in result.stderr, result.stderr


def test_bench_fleet_refuses_more_daemons_than_the_server_has_connections_for(db_dsn):
    result = run_fleet_bench(db_dsn, "--daemons", "1,1000", "--tasks", "10", "--runs", "1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "--daemons: 1000 daemons may hold" in result.stderr and "max_connections" in \
        result.stderr, result.stderr
    assert bench_schemas(db_dsn) == 0
