"""Fault scenario 3: the database restarted three times while two daemons work (fast,
immediate, fast): the daemons stay up, each process logs the outage once, /healthz goes 503
and back to 200, and nothing is lost or run twice at once.

The server is this test's own (never the machine's), with durable commits: an immediate stop
must not take back a commit a client was told had landed, or "nothing lost" would test the
server's settings rather than the daemon.
"""

from __future__ import annotations

import os
import time

import psycopg
import pytest

from conftest import wait_until
from executions import audit, read_runs
from pgcluster import ThrowawayPostgres, free_port
from supervisor import Client
from supervisor.db.migrate import migrate

pytest_plugins = ["daemon"]

LEASE = 6
TASKS_PER_ROUND = 1500
# How each restart stops the server, and how long it stays down: the last outage outlasts
# the lease, so leases run out while nobody can renew them.
# PGTASKD_LONG_OUTAGE lengthens the last one (recovery after minutes away, run by hand).
RESTARTS = (("fast", 0.0), ("immediate", 3.0),
            ("fast", float(os.environ.get("PGTASKD_LONG_OUTAGE", LEASE + 2.0))))
MODES = tuple(mode for mode, _ in RESTARTS)
# Events a process logs when it loses the database, at most once per outage each.
OUTAGE_EVENTS = ("loop_error", "final_write_retry", "lease_renew_failed", "reaper_failing",
                 "health_failing", "retention_failing", "wakeups_unavailable",
                 "scheduler_failing", "database_waiting")


@pytest.fixture
def durable_postgres():
    server = ThrowawayPostgres(durable=True)
    try:
        server.init()
        server.start()
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE pgtaskd")
        with psycopg.connect(server.dsn("pgtaskd"), autocommit=True) as conn:
            migrate(conn)
        yield server
    finally:
        server.destroy()


def counts(dsn: str) -> dict[str, int] | None:
    """Tasks by status, or None while the server is away."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as conn:
            return dict(conn.execute("SELECT status, count(*) FROM tasks GROUP BY status"
                                     ).fetchall())
    except psycopg.OperationalError:
        return None


def completed(dsn: str) -> int:
    return (counts(dsn) or {}).get("COMPLETED", 0)


def submit(dsn: str, log, first: int, count: int) -> list[str]:
    ids = [f"t{n}" for n in range(first, first + count)]
    with Client(dsn) as client:
        client.submit_many({"task_type": "sleeps", "task_id": task_id, "max_retries": 50,
                            "payload": {"log": str(log), "seconds": 0.01}} for task_id in ids)
    return ids


def health(daemon) -> int | None:
    try:
        return daemon.healthz()[0]
    except OSError:
        return None


def test_daemons_ride_out_three_database_restarts(durable_postgres, start_daemon, tmp_path):
    server = durable_postgres
    dsn = server.dsn("pgtaskd")
    log = tmp_path / "runs.log"
    tree = dict(lease={"seconds": LEASE, "renew_interval": 1.5},
                database={"connect_timeout": 1}, health={"interval": 0.5})
    daemons = [start_daemon(name, dsn=dsn, pools={"default": {"processes": 2}},
                            metrics={"listen": f"127.0.0.1:{free_port()}"}, **tree)
               for name in ("one", "two")]
    for daemon in daemons:
        daemon.wait_for("worker_booted", count=2)
        wait_until(lambda: health(daemon) == 200, message=f"{daemon.name} healthy")
    task_ids = submit(dsn, log, 0, TASKS_PER_ROUND)

    outages = []  # (mode, stopped at, started at) on the monotonic clock of the runs' log
    for round_no, (mode, down) in enumerate(RESTARTS):
        # Work is under way and some of it left: the restart lands in the middle of it.
        before = completed(dsn)
        wait_until(lambda: completed(dsn) >= before + 100, timeout=60,
                   message="tasks completing before the restart")
        assert completed(dsn) < len(task_ids), "the work ended before the restart"
        marks = [daemon.mark() for daemon in daemons]

        stopped = time.monotonic()
        server.stop(mode)
        for daemon in daemons:
            wait_until(lambda: health(daemon) == 503, timeout=15,
                       message=f"{daemon.name}'s /healthz to fail with the database away")
        to_503 = time.monotonic() - stopped
        time.sleep(max(0.0, stopped + down - time.monotonic()))  # the outage itself
        server.start()
        started = time.monotonic()
        outages.append((mode, stopped, started))
        for daemon in daemons:
            wait_until(lambda: health(daemon) == 200, timeout=30,
                       message=f"{daemon.name}'s /healthz to recover")
        healthy_after = time.monotonic() - started
        done_at_restart = completed(dsn)
        wait_until(lambda: completed(dsn) > done_at_restart, timeout=30,
                   message="tasks to complete again")
        working_after = time.monotonic() - started
        print(f"\nrestart {round_no + 1} ({mode}, down {started - stopped:.1f} s): "
              f"/healthz 503 after {to_503:.1f} s, "
              f"200 again {healthy_after:.1f} s after the start, "
              f"tasks completing {working_after:.1f} s after it")

        # Once per outage: no process repeats an outage event while the database is away.
        for daemon, mark in zip(daemons, marks):
            assert daemon.returncode() is None, daemon.log_tail()
            seen: dict[tuple[int, str], int] = {}
            for event in daemon.events[mark:]:
                if event.get("event") in OUTAGE_EVENTS:
                    # A final write is per task: a worker may have one per claim it held.
                    key = (event.get("pid"), event["event"], event.get("task_id"))
                    seen[key] = seen.get(key, 0) + 1
            repeated = {key: n for key, n in seen.items() if n > 1}
            assert not repeated, f"{daemon.name} logged an outage more than once: {repeated}"
        task_ids += submit(dsn, log, len(task_ids), TASKS_PER_ROUND // 3)

    wait_until(lambda: completed(dsn) == len(task_ids), timeout=120,
               message="every task to complete")

    def during_an_outage(run: dict) -> bool:
        # A run whose final write or lease renewal met the outage may be run again once its
        # lease ran out: the outage explains that second run.
        return any(run["start"] <= started + LEASE + 5 and (run["end"] or run["start"]) >=
                   stopped - 1 for _, stopped, started in outages)

    report = audit(read_runs(log), task_ids, ended_by={}, explained=during_an_outage)
    print(f"database restarts: {len(task_ids)} tasks, {len(MODES)} restarts "
          f"({', '.join(MODES)}), {report['runs']} runs, {report['duplicates']} duplicates, "
          f"0 lost")
    assert report["problems"] == [], report["problems"][:10]
    assert counts(dsn) == {"COMPLETED": len(task_ids)}
    for daemon in daemons:
        assert daemon.returncode() is None
        assert not daemon.find("final_state_lost")
        assert not daemon.other_lines, daemon.other_lines[:5]
