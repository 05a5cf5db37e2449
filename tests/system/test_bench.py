"""``pgtaskd bench`` runs a real daemon and bare claim loops, reports what it measured, and
leaves nothing behind. A smoke test on 500 tasks: the figures themselves are for people."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg


def run_bench(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "bench", *args],
                          env={**os.environ, "PGTASKD_DSN": dsn}, capture_output=True, text=True,
                          timeout=300)


def test_bench_measures_every_figure_and_cleans_up(db_dsn):
    result = run_bench(db_dsn, "--tasks", "500", "--processes", "2", "--batch-size", "5",
                       "--runs", "1", "--latency-samples", "20", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["options"]["tasks"] == 500 and report["options"]["batch_size"] == 5
    (run,) = report["runs"]
    for key in ("submit_per_second", "submit_many_per_second", "ceiling_per_second",
                "drain_per_second"):
        assert run[key] > 0, key
    assert run["latency"]["samples"] == 20
    assert 0 < run["latency"]["p50_ms"] <= run["latency"]["p95_ms"] <= run["latency"]["p99_ms"]
    for moment in ("memory_idle", "memory_after"):
        assert run[moment]["supervisor_mib"] > 0 and run[moment]["worker_max_mib"] > 0
    assert set(run["cpu_us_per_task"]) >= {"supervisor", "workers"}
    assert report["median"]["drain_percent_of_ceiling"] > 0
    with psycopg.connect(db_dsn) as conn:
        left = conn.execute("SELECT count(*) FROM pg_namespace "
                            "WHERE nspname LIKE 'pgtaskd_bench_%'").fetchone()[0]
        # The bench never writes to the operator's own tasks table.
        own = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
    assert left == 0
    assert own == 0


def test_bench_prints_a_table_and_a_progress_line(db_dsn):
    result = run_bench(db_dsn, "--tasks", "200", "--runs", "1", "--latency-samples", "5")
    assert result.returncode == 0, result.stderr[-2000:]
    for label in ("submit, one per call", "submit_many", "ceiling: claim+complete SQL",
                  "drain, real daemon", "pickup latency p50/p95/p99 (ms)",
                  "memory, largest RSS (MiB)", "CPU per drained task (us)"):
        assert label in result.stdout, result.stdout
    # Not a terminal: one progress line per phase on stderr.
    assert "run 1/1: drain" in result.stderr


def test_bench_refuses_bad_arguments_in_one_line(db_dsn):
    result = run_bench(db_dsn, "--batch-size", "0")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "--batch-size" in result.stderr


def test_bench_drains_waiting_handlers_concurrently(db_dsn):
    """Issue 16.6: --work-ms with --concurrency, plain and --async. The drain ends only once
    every task is COMPLETED (else the command fails), and it must beat what the processes
    could do one task at a time: 100 tasks of 20 ms on 2 processes take 1 s that way."""
    tasks, work_ms, processes, concurrency = 100, 20, 2, 10
    one_at_a_time = processes * 1000 / work_ms
    for handler in ("plain", "async"):
        result = run_bench(db_dsn, "--tasks", str(tasks), "--work-ms", str(work_ms),
                           "--concurrency", str(concurrency), "--processes", str(processes),
                           "--runs", "1", "--latency-samples", "0",
                           *(["--async"] if handler == "async" else []))
        assert result.returncode == 0, result.stderr[-2000:]
        out = result.stdout
        assert (f"{tasks} tasks, {processes} processes, batch size 1, concurrency "
                f"{concurrency}, {handler} handlers waiting {work_ms} ms") in out, out
        lines = {line[:34].strip(): line[34:] for line in out.splitlines()}
        drained = float(lines["drain, real daemon"].split("/s")[0].replace(",", ""))
        assert drained > 2 * one_at_a_time, out
        assert lines["worker RSS per concurrent task"].strip().endswith(
            f"over {concurrency} tasks at once)"), out
        assert "run 1/1: drain" in result.stderr
