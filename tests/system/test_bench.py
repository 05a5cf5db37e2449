"""``pgtaskd bench`` runs a real daemon and reports what it measured; its schema is gone after."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psycopg


def test_bench_completes_every_task_and_cleans_up(db_dsn):
    result = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "bench", "--tasks", "200", "--processes", "2",
         "--runs", "2", "--json"],
        env={**os.environ, "PGTASKD_DSN": db_dsn}, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert len(report["runs"]) == 2
    for run in report["runs"]:
        assert run["tasks"] == 200 and run["processes"] == 2
        assert run["not_completed"] == {}
        assert run["tasks_per_second"] > 0
    assert report["median_tasks_per_second"] > 0
    with psycopg.connect(db_dsn) as conn:
        left = conn.execute("SELECT count(*) FROM pg_namespace "
                            "WHERE nspname LIKE 'pgtaskd_bench_%'").fetchone()[0]
        # The bench never writes to the operator's own tasks table.
        own = conn.execute("SELECT count(*) FROM tasks").fetchone()[0]
    assert left == 0
    assert own == 0
