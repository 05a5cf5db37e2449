"""Many worker processes draining one queue: every task runs, once, under one owner at a time."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time

import yaml

from conftest import REPO_DIR, TEST_HANDLERS, wait_until

WORKERS = 8
TASKS = 2400


def write_config(folder) -> str:
    path = folder / "pgtaskd.yaml"
    path.write_text(yaml.safe_dump({
        "lease": {"seconds": 30, "renew_interval": 10},
        "poll_interval": 0.05,
        "retry": {"base_delay": 0, "max_delay": 0, "jitter": 0},
        "handlers": {"path": str(TEST_HANDLERS), "types": {"record": "basic:record"}},
        "pools": {"default": {"processes": WORKERS}},
    }))
    return str(path)


def start_workers(config_path: str, dsn: str, log_dir) -> list[tuple[subprocess.Popen, object]]:
    env = {**os.environ, "PGTASKD_DSN": dsn, "PGTASKD_LOG_LEVEL": "INFO"}
    started = []
    for slot in range(1, WORKERS + 1):
        log_path = log_dir / f"worker-{slot}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "supervisor.worker.main", "-c", config_path,
                 "--pool", "default", "--slot", str(slot)],
                env=env, cwd=str(REPO_DIR), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=log)
        started.append((process, log_path))
    return started


def stop_workers(started, deadline_seconds: float = 15.0) -> dict[int, int | None]:
    for process, _ in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + deadline_seconds
    codes = {}
    for process, _ in started:
        try:
            codes[process.pid] = process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
            codes[process.pid] = None
    return codes


def read_events(log_path) -> list[dict]:
    events = []
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            events.append({"event": "unparsed", "line": line})
    return events


def test_many_worker_processes_run_every_task_exactly_once(conn, db_dsn, tmp_path):
    config_path = write_config(tmp_path)
    started = start_workers(config_path, db_dsn, tmp_path)
    try:
        # All workers polling before the tasks appear, so that they claim at the same time.
        wait_until(lambda: all('"worker_started"' in log.read_text() for _, log in started),
                   timeout=30, interval=0.1, message="every worker to boot")
        began = time.monotonic()
        conn.execute("INSERT INTO tasks (id, name, task_type, payload) "
                     "SELECT 'task-' || g, 'load', 'record', '{}' FROM generate_series(1, %s) g",
                     (TASKS,))
        wait_until(lambda: conn.execute("SELECT count(*) FROM tasks WHERE status = 'COMPLETED'")
                   .fetchone()[0] == TASKS, timeout=60, interval=0.2,
                   message=f"all {TASKS} tasks to complete")
        drained = time.monotonic() - began
    finally:
        codes = stop_workers(started)

    assert list(codes.values()) == [0] * WORKERS, f"exit codes: {codes}"

    statuses = dict(conn.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall())
    assert statuses == {"COMPLETED": TASKS}
    runs, distinct_tasks, workers = conn.execute(
        "SELECT count(*), count(DISTINCT task_id), count(DISTINCT worker_id) FROM test_runs"
    ).fetchone()
    assert (runs, distinct_tasks) == (TASKS, TASKS), "a task ran twice, or not at all"
    attempts, tokens, max_retry = conn.execute(
        "SELECT sum(attempts), count(DISTINCT lease_token), max(retry_count) FROM tasks"
    ).fetchone()
    assert (attempts, tokens, max_retry) == (TASKS, TASKS, 0), "a task was claimed twice"

    events = {process.pid: read_events(log) for process, log in started}
    claims = collections.Counter(e["task_id"] for evs in events.values() for e in evs
                                 if e["event"] == "task_claimed")
    assert len(claims) == TASKS and set(claims.values()) == {1}
    # The worker that recorded a run is the one that claimed and completed it.
    completed_by = {e["task_id"]: e["worker_id"] for evs in events.values() for e in evs
                    if e["event"] == "task_completed"}
    recorded_by = dict(conn.execute("SELECT task_id, worker_id FROM test_runs").fetchall())
    assert completed_by == recorded_by
    trouble = [e for evs in events.values() for e in evs
               if e["event"] in ("stale_result_discarded", "loop_error", "final_state_lost",
                                 "final_write_retry")]
    assert not trouble, trouble[:5]

    per_worker = collections.Counter(recorded_by.values())
    print(f"\n{TASKS} tasks over {WORKERS} processes in {drained:.1f} s; "
          f"runs per worker: {sorted(per_worker.values(), reverse=True)}")
    assert workers > 1, "a single worker did all the work: nothing was shared"
