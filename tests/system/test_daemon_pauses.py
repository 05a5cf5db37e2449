"""Pausing a task type on a running daemon: no restart, no claim, no failing health check;
resuming starts the waiting tasks at once.

Canary tasks of another type prove that claims ran while the paused tasks were due: the
paused tasks were due an hour before each canary, so a claim that did not skip them would
have taken them first (the seed's order) and never reached the canary.
"""

from __future__ import annotations

import json
import time

import pytest

from conftest import wait_until
from daemon import metric_sum
from pgcluster import free_port
from supervisor import Client

pytest_plugins = ["daemon"]

PAUSED_TASKS = 20


@pytest.fixture
def client(db_dsn):
    with Client(db_dsn) as owned:
        yield owned


def add_overdue(conn, count: int = PAUSED_TASKS) -> None:
    """Echo tasks due an hour ago: far past any health.max_pending_age below."""
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "SELECT 'paused-' || g, 'n', 'echo', now() - interval '1 hour' "
                 "FROM generate_series(1, %s) g", (count,))


def paused_tasks(conn) -> list[tuple[str, int]]:
    """(status, attempts) of every paused-type task, in no particular order."""
    return conn.execute("SELECT status, attempts FROM tasks WHERE task_type = 'echo'").fetchall()


def run_canary(client: Client, conn, task_id: str, timeout: float = 10.0) -> None:
    client.submit("record", task_id=task_id)
    wait_until(lambda: conn.execute("SELECT status FROM tasks WHERE id = %s",
                                    (task_id,)).fetchone()[0] == "COMPLETED",
               timeout=timeout, message=f"canary {task_id} to complete")


def test_a_type_paused_on_a_polling_daemon_waits_and_runs_once_resumed(start_daemon, conn,
                                                                      client):
    """LISTEN is off: every claim here comes from a poll, so each canary is at least one more
    poll of each child that found the paused tasks due and skipped them."""
    port = free_port()
    d = start_daemon(poll_interval=0.1, database={"listen": False},
                     health={"interval": 0.2, "max_pending_age": 5},
                     metrics={"listen": f"127.0.0.1:{port}"})
    client.pause("echo")
    add_overdue(conn)
    for n in range(3):
        run_canary(client, conn, f"canary-{n}")
    assert paused_tasks(conn) == [("PENDING", 0)] * PAUSED_TASKS, "never claimed"

    wait_until(lambda: d.healthz()[1]["paused_task_types"] == ["echo"],
               message="the health check to see the pause")
    code, report = d.healthz()
    assert code == 200, report["failing"]
    assert report["checks"]["pending_age"]["paused_due"] == PAUSED_TASKS
    assert report["checks"]["pending_age"]["old_pending"] == 0
    assert report["paused_task_types"] == ["echo"]
    assert metric_sum(d.metrics(), "pgtaskd_task_type_paused", task_type="echo") == 1

    resumed = time.monotonic()
    client.resume("echo")
    wait_until(lambda: paused_tasks(conn) == [("COMPLETED", 1)] * PAUSED_TASKS, timeout=10,
               message="the resumed tasks to complete, each in one run")
    assert time.monotonic() - resumed < 5
    wait_until(lambda: not d.healthz()[1]["paused_task_types"], message="the health check "
               "to see the resume")
    assert "pgtaskd_task_type_paused" not in d.metrics()


def test_resume_wakes_idle_workers_of_a_daemon_that_polls_every_30_s(start_daemon, conn,
                                                                     client):
    d = start_daemon(poll_interval=30.0)
    d.wait_for("wakeups_listening")
    client.pause("echo")
    add_overdue(conn)
    run_canary(client, conn, "canary")  # started by its own insert's notification
    assert paused_tasks(conn) == [("PENDING", 0)] * PAUSED_TASKS
    resumed = time.monotonic()
    client.resume("echo")
    wait_until(lambda: paused_tasks(conn) == [("COMPLETED", 1)] * PAUSED_TASKS, timeout=10,
               message="the resumed tasks to complete")
    took = time.monotonic() - resumed
    assert took < 3.0, f"completed {took:.2f} s after the resume: no wake-up, only the poll"


def test_another_daemons_backlog_fails_neither_readiness_nor_liveness(start_daemon, conn):
    """18.4: a due task of a type this daemon has no handler for made /healthz 503, and a
    liveness probe on it would have restarted a healthy daemon. It counts apart, like a
    paused type's; /livez says only whether the process and its loop turn."""
    port = free_port()
    d = start_daemon(health={"interval": 0.2, "max_pending_age": 5},
                     metrics={"listen": f"127.0.0.1:{port}"})
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "SELECT 'theirs-' || g, 'n', 'nobody-here-runs-this', "
                 "now() - interval '1 hour' FROM generate_series(1, 3) g")
    report = wait_until(lambda: (lambda r: r[1] if r[1]["checks"]["pending_age"].get(
        "other_types_due") == 3 else None)(d.healthz()), message="the check to count them")
    code, report = d.healthz()
    assert code == 200, report["failing"]
    assert report["checks"]["pending_age"]["old_pending"] == 0
    code, body = d.http_get("/livez")
    live = json.loads(body)
    assert (code, live["status"]) == (200, "alive") and live["loop_age_seconds"] < 2
    assert d.http_get("/readyz")[0] == 200
