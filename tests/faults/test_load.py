"""Fault scenario 7, a load benchmark CI skips: 100,000 tasks of mixed priorities, a fifth of
them delayed, drained by two daemons (one claiming one task at a time, one in batches of 10).

It reports the throughput, the longest wait of a due task, and how often a task was claimed
while a task of higher priority that was already due waited more than a moment longer (a
priority inversion): with SKIP LOCKED a claim may pass over rows another claim holds for the
length of a statement, so "a moment" is INVERSION_SLACK. It also audits every execution as
the other scenarios do. Run it by hand:

    PGTASKD_LOAD_TASKS=100000 .venv/bin/pytest -s tests/faults/test_load.py
"""

from __future__ import annotations

import bisect
import os
import random
import time

import pytest

from conftest import wait_until
from executions import audit, read_runs
from supervisor import Client

pytest_plugins = ["daemon"]

TASKS = int(os.environ.get("PGTASKD_LOAD_TASKS", "0"))
INVERSION_SLACK = 0.2
MAX_DELAY = 20.0

pytestmark = pytest.mark.skipif(not TASKS, reason="a benchmark: set PGTASKD_LOAD_TASKS=100000")


def inversions(rows: list[tuple]) -> int:
    """Claims of a task while a higher-priority task, due already, was claimed more than
    INVERSION_SLACK later. rows: (priority, due, claimed) in seconds."""
    # For each priority, the claim times of the tasks due so far, sorted.
    due_claims: dict[int, list[float]] = {}
    by_due = sorted(rows, key=lambda row: row[1])
    next_due = 0
    count = 0
    for priority, _, claimed in sorted(rows, key=lambda row: row[2]):
        while next_due < len(by_due) and by_due[next_due][1] <= claimed:
            p, _, c = by_due[next_due]
            bisect.insort(due_claims.setdefault(p, []), c)
            next_due += 1
        if any(claims and claims[-1] > claimed + INVERSION_SLACK
               for p, claims in due_claims.items() if p > priority):
            count += 1
    return count


def test_a_hundred_thousand_tasks_of_mixed_priorities_and_delays(start_daemon, conn, db_dsn,
                                                                  tmp_path):
    log = tmp_path / "runs.log"
    tree = dict(poll_interval=0.5)
    daemons = [start_daemon("single", pools={"default": {"processes": 2}}, **tree),
               start_daemon("batched", pools={"default": {"processes": 2, "batch_size": 10}},
                            **tree)]
    for daemon in daemons:
        daemon.wait_for("worker_booted", count=2)
    rng = random.Random(11)
    with Client(db_dsn) as client:
        # Paused while it is submitted: a row becomes visible when its batch commits, but its
        # created_at is when the batch began, so tasks claimed meanwhile would seem to have
        # passed over tasks nobody could see yet.
        client.pause("sleeps")
        started = time.monotonic()
        for offset in range(0, TASKS, 10_000):
            client.submit_many(
                {"task_type": "sleeps", "task_id": f"t{n}", "priority": rng.randrange(10),
                 "delay": rng.uniform(0, MAX_DELAY) if rng.random() < 0.2 else None,
                 "payload": {"log": str(log), "seconds": 0}}
                for n in range(offset, min(offset + 10_000, TASKS)))
        submitted = time.monotonic() - started
        started = time.monotonic()
        client.resume("sleeps")
    wait_until(lambda: conn.execute("SELECT count(*) FROM tasks WHERE status <> 'COMPLETED'"
                                    ).fetchone()[0] == 0, timeout=1800, interval=0.5,
               message="every task to complete")
    elapsed = time.monotonic() - started

    # Due: when it was scheduled for, or when the type was resumed if that was later.
    rows = conn.execute(
        "SELECT priority, extract(epoch FROM greatest(scheduled_time, created_at))::float8, "
        "extract(epoch FROM started_at)::float8, attempts FROM tasks").fetchall()
    resumed = min(claimed for _, _, claimed, _ in rows)
    rows = [(p, max(due, resumed), claimed, attempts) for p, due, claimed, attempts in rows]
    longest_wait = max(claimed - due for _, due, claimed, _ in rows)
    inverted = inversions([(p, due, claimed) for p, due, claimed, _ in rows])
    report = audit(read_runs(log), [f"t{n}" for n in range(TASKS)], ended_by={})
    print(f"\nload: {TASKS:,} tasks submitted in {submitted:.1f} s, drained in "
          f"{elapsed:.1f} s ({TASKS / elapsed:,.0f} tasks/s, 2 daemons x 2 children, one "
          f"claiming singly, one in batches of 10); longest wait of a due task "
          f"{longest_wait:.1f} s; {inverted} claims ({100 * inverted / TASKS:.2f}%) passed "
          f"over a due task of higher priority for more than {INVERSION_SLACK} s; "
          f"{report['duplicates']} duplicates, 0 lost")
    assert report["problems"] == [], report["problems"][:10]
    assert report["duplicates"] == 0
    assert all(attempts == 1 for *_, attempts in rows)
    assert inverted == 0
    for daemon in daemons:
        assert daemon.returncode() is None
