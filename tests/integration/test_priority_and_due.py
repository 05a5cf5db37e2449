"""Which task runs next: priority first, then the oldest due; never early, never of unknown type."""

from __future__ import annotations

from datetime import timedelta

from conftest import wait_until
from worker_fixtures import add_task, recorded_runs, run_until_idle, task_row

from supervisor.db import store

pytest_plugins = ["worker_fixtures"]


def db_now(conn):
    return conn.execute("SELECT now()").fetchone()[0]


def test_high_priority_runs_before_low(conn, make_worker):
    worker = make_worker(types=["record"])
    now = db_now(conn)
    # Inserted, and scheduled, lowest priority first: age alone would give the reverse order.
    for age, (task_id, priority) in enumerate([("low", -5), ("normal", 0), ("high", 10),
                                               ("urgent", 100)]):
        add_task(conn, task_id, task_type="record", priority=priority,
                 scheduled_time=now - timedelta(minutes=10 - age))

    run_until_idle(worker)

    assert [run[0] for run in recorded_runs(conn)] == ["urgent", "high", "normal", "low"]


def test_equal_priority_runs_the_earliest_scheduled_first(conn, make_worker):
    worker = make_worker(types=["record"])
    now = db_now(conn)
    for task_id, minutes_ago in [("recent", 1), ("oldest", 30), ("middle", 10)]:
        add_task(conn, task_id, task_type="record", priority=5,
                 scheduled_time=now - timedelta(minutes=minutes_ago))

    run_until_idle(worker)

    assert [run[0] for run in recorded_runs(conn)] == ["oldest", "middle", "recent"]


def test_a_task_due_in_the_future_is_not_claimed_until_due(conn, make_worker):
    worker = make_worker(types=["record"])
    now = db_now(conn)
    add_task(conn, "later", task_type="record", scheduled_time=now + timedelta(hours=1))
    add_task(conn, "due", task_type="record", scheduled_time=now - timedelta(seconds=1))

    assert [o.name for o in run_until_idle(worker)] == ["completed"]

    assert task_row(conn, "due")["status"] == "COMPLETED"
    later = task_row(conn, "later")
    assert (later["status"], later["attempts"]) == ("PENDING", 0)
    # Move the clock: once its time has come, the same task is claimed.
    conn.execute("UPDATE tasks SET scheduled_time = now() - interval '1 second' "
                 "WHERE id = 'later'")
    assert [o.name for o in run_until_idle(worker)] == ["completed"]
    assert task_row(conn, "later")["status"] == "COMPLETED"


def test_a_task_of_an_unknown_type_is_never_claimed(conn, make_worker):
    worker = make_worker(types=["echo"])
    assert worker.task_types == ("echo",)
    # The unknown task is the most urgent one: a claim that ignored the type would take it.
    add_task(conn, "mystery-task", task_type="mystery", priority=100)
    add_task(conn, "echo-task", task_type="echo")

    assert [o.name for o in run_until_idle(worker)] == ["completed"]

    mystery = task_row(conn, "mystery-task")
    assert (mystery["status"], mystery["attempts"], mystery["claimed_by"]) == ("PENDING", 0, None)
    assert task_row(conn, "echo-task")["status"] == "COMPLETED"


def test_a_worker_without_handlers_claims_nothing(conn, make_worker):
    worker = make_worker(handlers={})
    add_task(conn, "t1")
    assert worker.run_once() is None
    assert task_row(conn, "t1")["attempts"] == 0


# Staging (migration 0010): the claim's index holds only the PENDING rows whose time is at
# most the staging lead (1 s) away, so future rows cost a claim nothing.

def staged(conn, task_id):
    return conn.execute("SELECT staged FROM tasks WHERE id = %s", (task_id,)).fetchone()[0]


def test_the_staged_flag_is_right_whatever_a_writer_sets(conn):
    """Plain SQL may write any value: the flag follows the row's time on every write that
    makes it PENDING or moves its time, so only time passing leaves a due row unstaged."""
    conn.execute("INSERT INTO tasks (id, name, task_type, priority, scheduled_time, staged) "
                 "VALUES ('later', 'n', 'echo', 0, now() + interval '1 hour', true), "
                 "('due', 'n', 'echo', 0, now(), false)")
    assert (staged(conn, "later"), staged(conn, "due")) == (False, True)
    conn.execute("UPDATE tasks SET staged = true WHERE id = 'later'")
    assert staged(conn, "later") is False
    conn.execute("UPDATE tasks SET scheduled_time = now() - interval '1 s' WHERE id = 'later'")
    assert staged(conn, "later") is True
    # A retry: claimed, then PENDING again with its backoff ahead.
    conn.execute("UPDATE tasks SET status = 'RUNNING', claimed_by = 'w' WHERE id = 'due'")
    conn.execute("UPDATE tasks SET status = 'PENDING', scheduled_time = now() + interval '1 min' "
                 "WHERE id = 'due'")
    assert staged(conn, "due") is False


def test_a_task_whose_time_came_is_taken_by_the_first_claim_after(conn):
    """Nobody staged it before its time (an idle queue): the claim that finds it due stages
    it and takes it in the same call, not a poll later."""
    conn.execute("INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
                 "VALUES ('soon', 'n', 'echo', 0, now() + interval '1.3 s')")
    assert staged(conn, "soon") is False
    wait_until(lambda: conn.execute("SELECT scheduled_time <= now() FROM tasks "
                                    "WHERE id = 'soon'").fetchone()[0], timeout=5,
               message="the task's time to come")
    claimed = store.claim_tasks(conn, worker_id="w", task_types=["echo"], lease_seconds=30)
    assert [row["id"] for row in claimed] == ["soon"]


def test_a_task_whose_time_comes_on_a_busy_queue_is_taken_first_from_its_first_instant(conn):
    """Claims that run while its time nears stage it ahead (the lead), so the first claim at
    or after its time takes it before the lower-priority work that was due before it."""
    conn.execute("INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
                 "SELECT 'low' || g, 'n', 'echo', 0, now() - g * interval '1 ms' "
                 "FROM generate_series(1, 200) g")
    conn.execute("INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
                 "VALUES ('high', 'n', 'echo', 9, now() + interval '1.5 s')")

    def claim_one():
        rows = store.claim_tasks(conn, worker_id="w", task_types=["echo"], lease_seconds=30)
        return rows and rows[0]["id"] == "high"

    wait_until(claim_one, timeout=10, interval=0.02, message="'high' to be claimed")
    late = conn.execute(
        "SELECT count(*) FROM tasks AS low, tasks AS high WHERE high.id = 'high' "
        "AND low.id LIKE 'low%%' AND low.started_at >= high.scheduled_time").fetchone()[0]
    assert late == 0, "a claim after 'high' was due took lower-priority work first"
