"""Which task runs next: priority first, then the oldest due; never early, never of unknown type."""

from __future__ import annotations

from datetime import timedelta

from worker_fixtures import add_task, recorded_runs, run_until_idle, task_row

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
