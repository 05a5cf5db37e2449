"""Batch claims (pools.<name>.batch_size): one statement claims several due tasks, run in the
seed's order, each under its own lease and token; none waits long behind a slow handler."""

from __future__ import annotations

import threading

import pytest

from conftest import make_config, wait_until
from supervisor.channel import Link, socket_pair
from supervisor.db import store
from supervisor.worker.leases import SupervisedLeases
from worker_fixtures import add_task, looping, task_row

pytest_plugins = ["worker_fixtures"]


def run_order(conn) -> list[str]:
    return [task_id for (task_id,) in conn.execute("SELECT task_id FROM test_runs ORDER BY at")]


def test_a_batch_is_claimed_in_one_statement_and_run_in_priority_order(conn, make_worker):
    worker = make_worker(types=["record"], batch_size=5)
    for task_id, priority in [("p0", 0), ("p9", 9), ("p5", 5), ("p7", 7), ("p1", 1)]:
        add_task(conn, task_id, "record", priority=priority)

    worker.run_once()

    assert run_order(conn) == ["p9", "p7", "p5", "p1", "p0"]
    rows = [task_row(conn, task_id) for task_id in ("p0", "p1", "p5", "p7", "p9")]
    assert {row["status"] for row in rows} == {"COMPLETED"}
    # One statement: one transaction, one now() for every claim of the batch.
    assert len({row["started_at"] for row in rows}) == 1
    assert len({row["lease_token"] for row in rows}) == 5


def test_tasks_waiting_behind_a_slow_handler_are_given_back_for_others(conn, db_dsn,
                                                                       make_worker, events):
    worker = make_worker(types=["sleep", "record"], batch_size=3)
    helper = make_worker(types=["record"], worker_id="worker-2")
    add_task(conn, "slow", "sleep", {"seconds": 4}, priority=9)
    add_task(conn, "w1", "record")
    add_task(conn, "w2", "record")
    runner = threading.Thread(target=worker.run_once)
    runner.start()
    try:
        wait_until(lambda: events.of("batch_released"), timeout=5,
                   message="the waiting tasks to be given back")
        for task_id in ("w1", "w2"):
            stored = task_row(conn, task_id)
            assert (stored["status"], stored["retry_count"], stored["claimed_by"]) == \
                ("PENDING", 0, None), stored
        # Another worker runs them while the slow one still runs.
        assert helper.run_once().name == "completed"
        assert helper.run_once().name == "completed"
        assert task_row(conn, "slow")["status"] == "RUNNING"
    finally:
        runner.join(10)
    assert task_row(conn, "slow")["status"] == "COMPLETED"
    assert sorted(run_order(conn)) == ["w1", "w2"]
    (released,) = events.of("batch_released")
    assert (released["tasks"], released["released"]) == (2, 2)


def test_a_batchs_finished_work_is_written_while_a_later_handler_runs(conn, make_worker):
    worker = make_worker(types=["sleep", "record"], batch_size=2)
    add_task(conn, "quick", "record", priority=9)
    add_task(conn, "slow", "sleep", {"seconds": 3})
    runner = threading.Thread(target=worker.run_once)
    runner.start()
    try:
        wait_until(lambda: task_row(conn, "quick")["status"] == "COMPLETED", timeout=3,
                   message="the quick task's completion, written before the slow one ends")
        assert task_row(conn, "slow")["status"] == "RUNNING"
    finally:
        runner.join(10)
    assert task_row(conn, "slow")["status"] == "COMPLETED"


def test_stopping_mid_batch_finishes_the_running_task_and_gives_back_the_rest(conn,
                                                                             make_worker):
    worker = make_worker(types=["record_then_sleep", "record"], batch_size=3)
    add_task(conn, "first", "record_then_sleep", {"seconds": 0.8}, priority=9)
    add_task(conn, "second", "record")
    add_task(conn, "third", "record")
    with looping(worker):
        # RUNNING alone is not enough: the whole batch is RUNNING once claimed, before any
        # handler starts, and a stop then gives all three back.
        wait_until(lambda: run_order(conn) == ["first"], message="the first handler to start")
        worker.stop()
    assert task_row(conn, "first")["status"] == "COMPLETED"
    for task_id in ("second", "third"):
        stored = task_row(conn, task_id)
        assert (stored["status"], stored["retry_count"]) == ("PENDING", 0), stored
    assert run_order(conn) == ["first"]


def test_a_task_cancelled_while_it_waits_in_a_batch_never_runs(conn, db_dsn, make_worker,
                                                              events):
    config = make_config(db_dsn, lease={"seconds": 3, "renew_interval": 0.2})
    worker = make_worker(config, types=["sleep", "record"], batch_size=2)
    add_task(conn, "first", "sleep", {"seconds": 0.7}, priority=9)
    add_task(conn, "waiting", "record")
    runner = threading.Thread(target=worker.run_once)
    runner.start()
    try:
        wait_until(lambda: task_row(conn, "first")["status"] == "RUNNING", message="the batch")
        assert store.cancel_task(conn, "waiting")
    finally:
        runner.join(10)
    assert task_row(conn, "waiting")["status"] == "CANCELLED"
    assert run_order(conn) == []
    assert events.of("task_cancelled")


def test_a_claim_taken_back_while_it_waited_never_starts_and_costs_no_retry(conn,
                                                                            make_worker):
    """A daemon's child reads its link right before it starts each claim: a claim its
    supervisor took back while the child was stopped never starts, though nothing else read
    the link (no inbox thread runs here) and its lease is good by the child's clock. w2 was
    given back by the supervisor; w3 was only told lost (the child was let go before the
    supervisor released it) and is still the child's in the database: it gives it back
    itself. Neither spends a retry (max_retries 0)."""
    supervisor_sock, child_sock = socket_pair()
    supervisor = Link(supervisor_sock, blocking=False)
    ran = []

    def head(task):
        # What stopped_children.py does while the child is stopped.
        (claimed,), _ = supervisor.receive()
        tokens = {task_id: token for task_id, token, _ in claimed["claims"]}
        assert store.release_tasks(conn, [("w2", tokens["w2"])]) == {"w2"}
        for task_id in ("w2", "w3"):
            supervisor.send("lost", token=tokens[task_id], reason="taken back")

    worker = make_worker(handlers={"head": head, "echo": lambda task: ran.append(task.id)},
                         batch_size=3,
                         leases=lambda w: SupervisedLeases(Link(child_sock, blocking=True), w,
                                                           pool_name="default"))
    add_task(conn, "first", "head", priority=9, max_retries=0)
    for task_id in ("w2", "w3"):
        add_task(conn, task_id, "echo", max_retries=0)

    assert worker.run_once().name == "completed"

    assert ran == []
    for task_id in ("w2", "w3"):
        stored = task_row(conn, task_id)
        assert (stored["status"], stored["retry_count"], stored["claimed_by"]) == \
            ("PENDING", 0, None), stored
    assert task_row(conn, "first")["status"] == "COMPLETED"


@pytest.mark.parametrize("column, moment", [("created_at", "20000-01-01 00:00Z"),
                                            ("scheduled_time", "0100-01-01 00:00Z BC")])
def test_a_time_python_cannot_hold_costs_neither_its_task_nor_its_batch(conn, make_worker,
                                                                       column, moment):
    seen = {}

    def remember(task):
        seen[task.id] = (task.scheduled_time, task.created_at)

    worker = make_worker(handlers={"echo": remember}, batch_size=3)
    for task_id in ("first", "odd", "last"):
        add_task(conn, task_id)
    conn.execute(f"UPDATE tasks SET {column} = %s WHERE id = 'odd'", (moment,))

    worker.run_once()

    assert {t: task_row(conn, t)["status"] for t in seen} == dict.fromkeys(
        ["first", "odd", "last"], "COMPLETED")
    assert all(task_row(conn, t)["attempts"] == 1 for t in seen)
    # As an infinite time does, it reaches the handler as None; the others as they are.
    assert seen["odd"][("scheduled_time", "created_at").index(column)] is None
    assert all(None not in seen[t] for t in ("first", "last"))
