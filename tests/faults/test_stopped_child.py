"""Fault scenario 2: a child SIGSTOPped in the middle of its task, past its lease, then
SIGCONT. Nobody renews a stopped child's lease, so another daemon's child takes the task over
once the lease ran out and completes it; the stopped handler, let go again, finds by its own
clock that the task is no longer its own and stops, and its late result is discarded: the
row keeps the second run's outcome. The stopped run ran no code while it was stopped, so its
execution counts as ended when it was stopped (tests/executions.py's ended_by)."""

from __future__ import annotations

import os
import signal
import time

from conftest import task_row, wait_until
from executions import audit, read_runs
from supervisor import Client

pytest_plugins = ["daemon"]


def test_a_child_stopped_past_its_lease_loses_the_task_and_its_result_is_discarded(
        start_daemon, conn, db_dsn, tmp_path):
    lease = 3.0
    log = tmp_path / "runs.log"
    tree = dict(lease={"seconds": lease, "renew_interval": 0.5}, poll_interval=0.1)
    first = start_daemon("first", pools={"default": {"processes": 1}}, **tree)
    first.wait_for("worker_booted")
    with Client(db_dsn) as client:
        client.submit("works", {"log": str(log), "seconds": 6}, task_id="t0", max_retries=5)
    (run,) = wait_until(lambda: read_runs(log), message="the first run to start")
    second = start_daemon("second", pools={"default": {"processes": 2}}, **tree)
    second.wait_for("worker_booted", count=2)
    os.kill(run["pid"], signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        second.wait_for("task_claimed", task_id="t0", timeout=30)
        taken_after = time.monotonic() - stopped_at
        wait_until(lambda: task_row(conn, "t0")["status"] == "COMPLETED", timeout=30,
                   message="the second daemon to complete the task")
        held_for = time.monotonic() - stopped_at
    finally:
        os.kill(run["pid"], signal.SIGCONT)
    resumed_at = time.monotonic()
    first.wait_for("stale_result_discarded", task_id="t0", timeout=30)
    runs = read_runs(log)
    stopped_run = next(r for r in runs if r["pid"] == run["pid"])
    ran_on = stopped_run["end"] - resumed_at
    row = task_row(conn, "t0")
    assert row["status"] == "COMPLETED" and row["claimed_by"] is None
    assert row["lease_token"] != first.find("task_claimed", task_id="t0")[0]["token"]
    # The stopped run is cut at the stop for the overlap check: it ran nothing after it.
    stopped_run["end"] = None
    report = audit(runs, ["t0"], ended_by={run["pid"]: stopped_at})
    print(f"\nstopped child: taken over {taken_after:.1f} s after SIGSTOP (lease {lease:g} s), "
          f"held stopped {held_for:.1f} s; after SIGCONT its handler stopped within "
          f"{ran_on * 1000:.0f} ms and its result was discarded; {report['duplicates']} "
          f"duplicate (the takeover), 0 lost")
    assert report["problems"] == [], report["problems"]
    assert taken_after >= lease - 0.5 - 0.1
    assert ran_on < 1.0, "the resumed handler went on working on a task it had lost"
    for daemon in (first, second):
        assert daemon.returncode() is None
