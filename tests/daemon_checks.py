"""Waits and checks the daemon system tests share: task statuses, runs, process titles,
pools, /healthz and quiet logs, each with a deadline."""

from __future__ import annotations

import time

import psycopg

from conftest import wait_until
from daemon import Daemon, cmdline


FINAL = ("COMPLETED", "FAILED", "CANCELLED")



def statuses(conn, ids) -> dict[str, str]:
    rows = conn.execute("SELECT id, status FROM tasks WHERE id = ANY(%s)", (list(ids),))
    return dict(rows.fetchall())


def wait_status(conn, ids, status, *, timeout: float = 20.0, daemons=()) -> None:
    """Wait until every task in ``ids`` has ``status`` (a string or a tuple of them)."""
    ids = list(ids)
    wanted = (status,) if isinstance(status, str) else tuple(status)
    deadline = time.monotonic() + timeout
    while True:
        now = statuses(conn, ids)
        if all(now.get(i) in wanted for i in ids):
            return
        if time.monotonic() >= deadline:
            logs = "\n".join(d.log_tail() for d in daemons)
            raise AssertionError(f"after {timeout} s not all {wanted}: "
                                 f"{ {i: now.get(i) for i in ids if now.get(i) not in wanted} }"
                                 f"\n{logs}")
        time.sleep(0.05)


def runs(conn, task_id: str | None = None) -> list[dict]:
    """Every run the test handlers recorded (test_runs), oldest first."""
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        if task_id is None:
            cur.execute("SELECT * FROM test_runs ORDER BY at")
        else:
            cur.execute("SELECT * FROM test_runs WHERE task_id = %s ORDER BY at", (task_id,))
        return cur.fetchall()


def count_status(conn, status: str) -> int:
    return conn.execute("SELECT count(*) FROM tasks WHERE status = %s", (status,)).fetchone()[0]


def wait_running_title(pid: int, task_id: str, timeout: float = 10.0) -> None:
    """The child's title says it runs this task. The child sets it right after it told the
    supervisor about the claim on its pipe, so the supervisor knows the claim from now on."""
    wait_until(lambda: f"running {task_id}" in cmdline(pid), timeout,
               message=f"title of {pid} to show 'running {task_id}' (is {cmdline(pid)!r})")


def spawned_by_pool(daemon: Daemon, since: int = 0) -> dict[int, str]:
    return {e["child_pid"]: e["pool"] for e in daemon.find("worker_spawned", since)}


def live_by_pool(daemon: Daemon) -> dict[str, int]:
    pools = spawned_by_pool(daemon)
    counts: dict[str, int] = {}
    for pid in daemon.children():
        counts[pools.get(pid, "?")] = counts.get(pools.get(pid, "?"), 0) + 1
    return counts


def wait_healthz(daemon: Daemon, code: int, timeout: float) -> dict:
    """Wait until /healthz answers ``code``; its body. On timeout, the last answer and the log."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = daemon.healthz()
        except OSError as exc:  # refused or timed out: keep trying until the deadline
            last = (None, repr(exc))
        if last[0] == code:
            return last[1]
        if time.monotonic() >= deadline:
            raise AssertionError(f"/healthz not {code} after {timeout} s; last answer: {last}\n"
                                 f"{daemon.log_tail()}")
        time.sleep(0.1)


def assert_quiet(daemon: Daemon, seconds: float, since: int, event: str, **fields) -> None:
    """For ``seconds``, no ``event`` matching ``fields`` may be logged (checked as it goes)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = daemon.find(event, since, **fields)
        assert not found, f"unexpected {event}: {found}\n{daemon.log_tail()}"
        time.sleep(0.1)


