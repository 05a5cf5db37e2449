"""Wake-ups on real daemons: idle children start new work at once, whoever inserts it.

Each test gives its daemon a poll_interval of 30 s, so a pickup within a second or two can
only be a wake-up; with LISTEN off, polling alone still finds the work.
"""

from __future__ import annotations

import time

import psycopg

from conftest import task_row, wait_until

pytest_plugins = ["daemon"]

SLOW_POLL = 30.0


def insert_raw(dsn: str, task_id: str, task_type: str = "echo", delay: float = 0.0) -> float:
    """A plain INSERT from another client (no pgtaskd code); the monotonic time it committed."""
    with psycopg.connect(dsn, autocommit=True) as other:
        other.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                      "VALUES (%s, 'raw', %s, now() + %s * interval '1 second')",
                      (task_id, task_type, delay))
    return time.monotonic()


def completed_within(conn, task_id: str, seconds: float) -> float:
    started = time.monotonic()
    wait_until(lambda: task_row(conn, task_id)["status"] == "COMPLETED", timeout=seconds,
               interval=0.01, message=f"{task_id} to complete")
    return time.monotonic() - started


def test_a_plain_insert_wakes_an_idle_worker_at_once(start_daemon, conn, db_dsn):
    d = start_daemon(poll_interval=SLOW_POLL, pools={"default": {"processes": 2}})
    d.wait_for("wakeups_listening")
    time.sleep(0.5)  # every child is idle and waiting
    for n in range(5):
        insert_raw(db_dsn, f"raw{n}")
        took = completed_within(conn, f"raw{n}", 5)
        assert took < 2.0, f"picked up after {took:.2f} s: no wake-up, only the poll"


def test_a_task_due_later_is_started_at_its_due_time(start_daemon, conn, db_dsn):
    d = start_daemon(poll_interval=SLOW_POLL)
    d.wait_for("wakeups_listening")
    committed = insert_raw(db_dsn, "later", delay=2.0)
    wait_until(lambda: task_row(conn, "later")["status"] == "COMPLETED", timeout=10,
               interval=0.01, message="the task due in 2 s")
    took = time.monotonic() - committed
    assert 1.9 <= took < 3.5, f"completed {took:.2f} s after it was submitted, due in 2 s"


def test_without_listen_polling_finds_the_work(start_daemon, conn, db_dsn):
    d = start_daemon(poll_interval=0.3, database={"listen": False})
    insert_raw(db_dsn, "polled")
    completed_within(conn, "polled", 5)
    assert not d.find("wakeups_listening")


def test_a_lost_listening_connection_is_replaced_and_logged_once(start_daemon, conn, db_dsn):
    d = start_daemon(poll_interval=SLOW_POLL)
    d.wait_for("wakeups_listening")
    mark = d.mark()
    with psycopg.connect(db_dsn, autocommit=True) as admin:
        killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE application_name = 'pgtaskd wakeups' "
                               "AND datname = current_database()").fetchall()
    assert killed == [(True,)]
    d.wait_for("wakeups_unavailable", since=mark)
    d.wait_for("wakeups_listening", since=mark, timeout=10)
    assert len(d.find("wakeups_unavailable", since=mark)) == 1
    insert_raw(db_dsn, "after")
    assert completed_within(conn, "after", 5) < 2.0
