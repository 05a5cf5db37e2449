"""Fault scenario 14: three hosts whose wall clocks disagree by an hour each way.

A daemon on each host of tests/hosts.py: one with the true time, one whose wall clock is an
hour ahead and one an hour behind (a preloaded library shifts the wall clock of that daemon
and its children only). What they share, PostgreSQL, keeps the true time, and every
comparison of times the daemon makes is the database's ``now()`` against a time the database
wrote, so the three must behave alike:

- leases: a claim's ``lease_until`` is at most one lease past the database's ``now()`` on
  every host, and tasks that outlive their lease run once, renewed in time;
- retries: a failed run's next attempt starts one backoff (1 s, then 2 s) after it ended;
- schedules: each host's own schedule, and one all three share, enqueue each instant once,
  on time by the database's clock (no instant an hour early, none withheld an hour);
- ``/healthz``: the same pending age on every host (a due task 100 s old counted, a task due
  in 20 minutes not);
- retention: each host deletes the finished rows 40 minutes old and keeps those 20 minutes
  old (each host applies it to one status, so that each host's verdict shows alone).

The shift comes from libfaketime (``FAKETIME=+1h``) where it can run CPython, else from
tests/clockshift.c, compiled here, which moves the wall clock alone. Debian 12's libfaketime
0.9.10 cannot: with CLOCK_MONOTONIC faked too (its default) it jumps that clock to the faked
wall time and CPython's timed waits (``threading.Event().wait(0.5)``) never return, their
deadline taken on the faked clock and waited for on the true one; with
``FAKETIME_DONT_FAKE_MONOTONIC=1`` every ``time.sleep()`` of Python 3.11 fails with EINVAL
(wolfcw/libfaketime#426). A real host's monotonic clock does not move with its wall clock;
the test checks both clocks of each shifted host before it starts the daemons.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Callable

import psycopg
import pytest

from conftest import wait_until
from daemon import HANDLER_TYPES, TESTS_DIR
from executions import audit, read_runs
from supervisor import Client

pytest_plugins = ["daemon", "hosts"]

LEASE = 3.0
OFFSETS = {"true": None, "ahead": "+1h", "behind": "-1h"}
# Each host deletes one status by retention, so that each one's verdict shows alone.
RETAINS = {"true": "cancelled", "ahead": "completed", "behind": "failed"}


def wall_clock_shifter(tmp_path) -> tuple[str, Callable[[str], dict[str, str]]]:
    """How this machine shifts one process's wall clock: a description, and the environment
    for a shift of "+1h" or "-1h". Skips where it cannot."""
    libfaketime = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)
    why_not = "no libfaketime (Debian package faketime)"
    if libfaketime:
        env = {"LD_PRELOAD": libfaketime, "FAKETIME": "+1h", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        probe = subprocess.run(
            [sys.executable, "-c", "import threading, time; time.sleep(0.01); "
             "threading.Event().wait(0.01); print(time.time())"],
            env={**os.environ, **env}, capture_output=True, text=True, timeout=10)
        if probe.returncode == 0 and abs(float(probe.stdout) - time.time() - 3600) < 60:
            return "libfaketime", lambda shift: {**env, "FAKETIME": shift}
        why_not = (f"libfaketime cannot run this Python "
                   f"({(probe.stderr.strip().splitlines() or ['?'])[-1]})")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip(f"no way to shift a wall clock: {why_not}, and no C compiler for "
                    f"tests/clockshift.c")
    library = tmp_path / "clockshift.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(library),
                    str(TESTS_DIR / "clockshift.c"), "-ldl"], check=True, capture_output=True)
    hours = {"+1h": "3600", "-1h": "-3600"}
    return (f"tests/clockshift.c ({why_not})",
            lambda shift: {"LD_PRELOAD": str(library), "CLOCKSHIFT_SECONDS": hours[shift]})


def host_tree(name: str, log) -> dict:
    work = ["works", f"works_{name}", f"fail_{name}"]
    return dict(
        lease={"seconds": LEASE, "renew_interval": 1}, poll_interval=0.1,
        retry={"base_delay": 1, "max_delay": 4, "jitter": 0},
        health={"interval": 0.5, "max_pending_age": 60},
        handlers={"types": {**HANDLER_TYPES, f"works_{name}": "timed_handlers:works",
                            f"fail_{name}": "basic:fail", "held": "basic:echo"}},
        # "held" is claimed by no child, so its due tasks wait: what /healthz reports on.
        pools={"default": {"processes": 2, "task_types": work},
               "parked": {"processes": 0, "task_types": ["held"]}},
        retention={"interval": 0.5, **{status: (1800 if status == RETAINS[name] else False)
                                        for status in ("completed", "failed", "cancelled")}},
        schedules={f"tick_{name}": tick(log), "tick": tick(log)},
    )


def tick(log) -> dict:
    return {"cron": "*/2 * * * * *", "task_type": "works", "catch_up": "all",
            "payload": {"log": str(log), "seconds": 0.01}}


def probe_clocks(host, env: dict[str, str]) -> tuple[float, float]:
    """How far the host's wall and monotonic clocks are from the test's, as its daemon
    would see them."""
    script = "import json, time; print(json.dumps([time.time(), time.monotonic()]))"
    before = (time.time(), time.monotonic())
    done = host.run(["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-c",
                     script], timeout=10)
    wall, mono = json.loads(done.stdout)
    return wall - before[0], mono - before[1]


def add_finished(conn, client, task_id: str, status: str, minutes_ago: int) -> None:
    client.submit("echo", {}, task_id=task_id)
    conn.execute("UPDATE tasks SET status = %s, finished_at = now() - make_interval(mins => %s),"
                 " updated_at = now() - make_interval(mins => %s) WHERE id = %s",
                 (status, minutes_ago, minutes_ago, task_id))


def test_hosts_an_hour_ahead_and_behind_behave_as_the_true_one(host_lab, tmp_path):
    how, shifted = wall_clock_shifter(tmp_path)
    log = tmp_path / "runs.log"
    hosts = dict(zip(OFFSETS, host_lab.add_hosts(len(OFFSETS))))
    envs = {name: shifted(offset) if offset else {} for name, offset in OFFSETS.items()}
    skew = {}
    for name in ("ahead", "behind"):
        wall, mono = probe_clocks(hosts[name], envs[name])
        skew[name] = wall
        assert abs(abs(wall) - 3600) < 60 and (wall > 0) == (name == "ahead"), (name, wall)
        assert abs(mono) < 5, f"{name}: its monotonic clock is off by {mono:.1f} s"

    conn = psycopg.connect(host_lab.dsn, autocommit=True)
    with conn, Client(host_lab.dsn) as client:
        for status in ("COMPLETED", "FAILED", "CANCELLED"):
            add_finished(conn, client, f"old-{status}", status, 40)
            add_finished(conn, client, f"recent-{status}", status, 20)
        for task_id, seconds in (("held-due", -100), ("held-later", 1200)):
            client.submit("held", {}, task_id=task_id)
            conn.execute("UPDATE tasks SET scheduled_time = now() + make_interval(secs => %s) "
                         "WHERE id = %s", (seconds, task_id))

        daemons = {name: host_lab.start(host, wait_ready=False, env=envs[name],
                                        **host_tree(name, log))
                   for name, host in hosts.items()}
        for daemon in daemons.values():
            daemon.wait_for("worker_booted", count=2, timeout=60)
        began = time.monotonic()
        long = {name: [f"long-{name}-{n}" for n in range(2)] for name in hosts}
        for name in hosts:
            client.submit_many({"task_type": f"works_{name}", "task_id": task_id,
                                "payload": {"log": str(log), "seconds": LEASE * 1.2}}
                               for task_id in long[name])
            client.submit(f"fail_{name}", {}, task_id=f"fail-{name}", max_retries=2)

        # Leases: set by the database's clock, whichever host claimed.
        every_long = [t for ids in long.values() for t in ids]
        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = 'RUNNING'",
            (every_long,)).fetchone()[0] == len(every_long), timeout=30,
            message="every long task to run")
        lease_left = dict(conn.execute(
            "SELECT id, extract(epoch FROM lease_until - now())::float8 FROM tasks "
            "WHERE id = ANY(%s)", (every_long,)).fetchall())
        for task_id, left in lease_left.items():
            assert 0 < left <= LEASE, f"{task_id}: lease_until is {left:.1f} s from now()"

        # /healthz: the same verdict and the same age on every host.
        def pending_checks() -> dict:
            return {name: d.healthz()[1]["checks"]["pending_age"] for name, d in daemons.items()}

        wait_until(lambda: all(c["old_pending"] == 1 for c in pending_checks().values()),
                   timeout=20, message="every host's /healthz to count the old task")
        ages = {name: c["oldest_pending_age_seconds"] for name, c in pending_checks().items()}
        assert max(ages.values()) - min(ages.values()) < 3, ages
        assert all(100 <= age < 160 for age in ages.values()), ages
        assert {d.healthz()[0] for d in daemons.values()} == {503}

        # Retention: 40 minutes old goes, 20 minutes old stays, on each host.
        olds = [f"old-{s}" for s in ("COMPLETED", "FAILED", "CANCELLED")]
        wait_until(lambda: not conn.execute("SELECT count(*) FROM tasks WHERE id = ANY(%s)",
                                            (olds,)).fetchone()[0],
                   timeout=20, message="retention to delete the old rows")
        for name, daemon in daemons.items():
            daemon.wait_for("retention_deleted", status=RETAINS[name].upper())
        recent = conn.execute("SELECT count(*) FROM tasks WHERE id LIKE 'recent-%'").fetchone()[0]
        assert recent == 3

        # Retries: each attempt one backoff after the one before, by the database's clock.
        fails = [f"fail-{name}" for name in hosts]
        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = 'FAILED'",
            (fails,)).fetchone()[0] == len(fails), timeout=30, message="the retries to end")
        gaps = {}
        for name in hosts:
            attempts = conn.execute(
                "SELECT started_at, ended_at FROM task_attempts WHERE task_id = %s ORDER BY id",
                (f"fail-{name}",)).fetchall()
            assert len(attempts) == 3, attempts
            gaps[name] = [round((b[0] - a[1]).total_seconds(), 2)
                          for a, b in zip(attempts, attempts[1:])]
            assert 1 <= gaps[name][0] < 1.8 and 2 <= gaps[name][1] < 2.8, (name, gaps[name])

        # Schedules: on time by the database's clock, each instant once.
        def enqueued(schedule: str) -> list[tuple[float, float]]:
            """(instant, created_at - instant) of each task the schedule enqueued."""
            return conn.execute(
                "SELECT extract(epoch FROM scheduled_time)::float8, "
                "extract(epoch FROM created_at - scheduled_time)::float8 FROM tasks "
                "WHERE id LIKE %s ORDER BY scheduled_time",
                (f"schedule:{schedule}:%",)).fetchall()

        wait_until(lambda: all(len(enqueued(f"tick_{name}")) >= 2 for name in hosts),
                   timeout=20, message="every host's schedule to enqueue twice")
        late = {name: max(lag for _, lag in enqueued(f"tick_{name}")) for name in hosts}
        assert all(0 <= lag <= 10 for lag in late.values()), late
        shared = enqueued("tick")
        assert all(b[0] - a[0] == 2 for a, b in zip(shared, shared[1:])), shared
        by_host = {name: len(d.find("schedule_enqueued", schedule="tick"))
                   for name, d in daemons.items()}

        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = 'COMPLETED'",
            (every_long,)).fetchone()[0] == len(every_long), timeout=30,
            message="the long tasks to complete")
        elapsed = time.monotonic() - began

    runs = read_runs(log)
    report = audit(runs, every_long, ended_by={})
    print(f"\nclocks ({how}): hosts {skew['ahead']:+.0f} s and {skew['behind']:+.0f} s off "
          f"(monotonic true); lease_until - now() {min(lease_left.values()):.2f}-"
          f"{max(lease_left.values()):.2f} s (lease {LEASE:g} s); {len(every_long)} tasks of "
          f"{LEASE * 1.2:g} s, {report['duplicates']} duplicates; retry gaps {gaps}; pending "
          f"age on /healthz {ages}; schedules on time (latest {max(late.values()):.2f} s), "
          f"{len(shared)} shared instants enqueued by {by_host}; retention kept 20-min rows, "
          f"deleted 40-min ones; {elapsed:.1f} s")
    assert report["problems"] == [] and report["duplicates"] == 0, report
    for daemon in daemons.values():
        assert daemon.returncode() is None
        assert not daemon.find("lease_lost")
        assert not daemon.other_lines, daemon.other_lines[:5]
