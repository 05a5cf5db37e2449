"""Cancellation: final for a pending task, cooperative for a running one, void for a done one."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import make_config, wait_until
from supervisor.config import RetryConfig
from supervisor.db import store
from supervisor.errors import TaskCancelled
from worker_fixtures import add_task, run_until_idle, task_row

pytest_plugins = ["worker_fixtures"]

NO_DELAY = RetryConfig(base_delay=0.0, max_delay=0.0, jitter=0.0)
LEASE = {"seconds": 1.5, "renew_interval": 0.3}


def claim(conn, worker_id: str, types=("echo",)):
    return store.claim_task(conn, worker_id=worker_id, task_types=types, lease_seconds=30)


def assert_stays_cancelled(conn, task_id: str, worker) -> None:
    """Nothing that runs after a cancel may bring the task back."""
    store.reap_expired_leases(conn, batch_size=100, retry=NO_DELAY)
    assert run_until_idle(worker) == []
    stored = task_row(conn, task_id)
    assert stored["status"] == "CANCELLED"
    assert stored["claimed_by"] is None and stored["lease_until"] is None


def test_cancelling_a_pending_task_keeps_it_from_running(conn, make_worker):
    worker = make_worker()
    add_task(conn, "t1")
    assert store.cancel_task(conn, "t1") is True
    stored = task_row(conn, "t1")
    assert stored["status"] == "CANCELLED"
    assert stored["finished_at"] is not None
    assert_stays_cancelled(conn, "t1", worker)
    assert task_row(conn, "t1")["attempts"] == 0


def test_a_cooperative_handler_stops_within_one_renew_interval_of_a_cancel(conn, db_dsn,
                                                                          make_worker, events):
    config = make_config(db_dsn, lease=LEASE)
    worker = make_worker(config, types=["cooperative"])
    cooperative = worker.handlers["cooperative"]
    stopped_at = []

    def watched(task):
        try:
            cooperative(task)
        except TaskCancelled:
            stopped_at.append(time.monotonic())
            raise

    worker.handlers["cooperative"] = watched
    add_task(conn, "t1", task_type="cooperative", payload={"max_seconds": 20})
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(worker.run_once()))
    runner.start()
    wait_until(lambda: task_row(conn, "t1")["status"] == "RUNNING", message="the claim")

    cancelled_at = time.monotonic()
    assert store.cancel_task(conn, "t1") is True
    runner.join(10)

    assert not runner.is_alive()
    assert stopped_at, "the handler never saw the cancel"
    # One renew interval, plus a renewal round trip and the handler's own 20 ms check.
    assert stopped_at[0] - cancelled_at < LEASE["renew_interval"] + 0.2
    assert outcome[0].name == "cancelled"
    assert events.of("task_cancelled")
    assert_stays_cancelled(conn, "t1", worker)


def test_cancelling_a_task_whose_handler_ignores_it_discards_the_result(conn, db_dsn,
                                                                        make_worker, events):
    config = make_config(db_dsn, lease=LEASE)
    worker = make_worker(config, types=["sleep"])
    add_task(conn, "t1", task_type="sleep", payload={"seconds": 0.8})
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(worker.run_once()))
    runner.start()
    wait_until(lambda: task_row(conn, "t1")["status"] == "RUNNING", message="the claim")

    assert store.cancel_task(conn, "t1") is True
    runner.join(10)

    # The handler ran to its end, yet the cancel stands: only the success write is refused.
    assert outcome[0].name == "stale"
    assert [e["result"] for e in events.of("stale_result_discarded")] == ["completed"]
    assert_stays_cancelled(conn, "t1", worker)


def held_slots(conn) -> list[str]:
    return [task_id for (task_id,) in conn.execute(
        "SELECT task_id FROM task_type_slots WHERE task_id IS NOT NULL "
        "AND lease_until > now() ORDER BY slot")]


@pytest.mark.parametrize("handler_then", ["stops", "returns", "raises"])
def test_a_cancelled_run_holds_its_slot_until_its_handler_ends_then_gives_it_back(
        conn, db_dsn, make_worker, handler_then):
    """Issue 14.5: a cancel gave the slot of a limited type back while the handler still ran,
    so another worker started the next task beside it. The slot is the run's until the
    handler ends, however it ends: stopping at the cancel, ignoring it and returning (a
    stale completion) or failing (a stale failure); then the worker gives it back at once."""
    store.set_task_type_limit(conn, "gated", 1, updated_by="test")
    saw_cancel, go_on = threading.Event(), threading.Event()

    def gated(task):
        while not task.is_cancelled():
            time.sleep(0.01)
        saw_cancel.set()
        go_on.wait(10)  # cancelled, and still running
        if handler_then == "stops":
            task.raise_if_cancelled()
        elif handler_then == "raises":
            raise ValueError("failed after the cancel")

    config = make_config(db_dsn, lease={"seconds": 30, "renew_interval": 0.3})
    worker = make_worker(config, handlers={"gated": gated}, batch_size=2)
    add_task(conn, "t0", task_type="gated", priority=1, max_retries=0)
    add_task(conn, "t1", task_type="gated", max_retries=0)
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(worker.run_once()))
    runner.start()
    try:
        wait_until(lambda: task_row(conn, "t0")["status"] == "RUNNING", message="the claim")
        assert store.cancel_task(conn, "t0") is True
        assert saw_cancel.wait(5), "the handler never saw the cancel"
        assert held_slots(conn) == ["t0"]
        assert store.claim_tasks(conn, worker_id="other", task_types=["gated"],
                                 lease_seconds=30) == []
    finally:
        go_on.set()
        runner.join(10)
    assert outcome[0].name == ("cancelled" if handler_then == "stops" else "stale")
    assert held_slots(conn) == []
    assert [row["id"] for row in store.claim_tasks(conn, worker_id="other",
                                                   task_types=["gated"],
                                                   lease_seconds=30)] == ["t1"]
    assert task_row(conn, "t0")["status"] == "CANCELLED"


@pytest.mark.parametrize("worker_hears", ["at_once", "after_the_batch_guard"])
def test_a_claim_cancelled_while_it_waits_in_a_batch_never_runs_and_gives_its_slot_back(
        conn, db_dsn, make_worker, events, worker_hears):
    """A claim waiting in a batch behind a slow handler will never start once it is
    cancelled: the worker settles it as soon as it hears, giving its slot back while the
    handler ahead still runs; and if the batch guard gives the batch back first, that
    release changes nothing (the claim ended) and the slot goes back with it too."""
    store.set_task_type_limit(conn, "gated", 2, updated_by="test")
    ran, go_on = [], threading.Event()

    def gated(task):
        ran.append(task.id)
        go_on.wait(10)

    renew = 0.3 if worker_hears == "at_once" else 10
    worker = make_worker(make_config(db_dsn, lease={"seconds": 30, "renew_interval": renew}),
                         handlers={"gated": gated}, batch_size=2)
    if worker_hears == "at_once":
        worker.batch_hold = 10.0  # the guard's give-back would free the slot too, later
    add_task(conn, "t0", task_type="gated", priority=1, max_retries=0)
    add_task(conn, "t1", task_type="gated", max_retries=0)
    runner = threading.Thread(target=lambda: run_until_idle(worker))
    runner.start()
    try:
        wait_until(lambda: ran == ["t0"], message="the batch's first run")
        assert held_slots(conn) == ["t0", "t1"]
        assert store.cancel_task(conn, "t1") is True
        if worker_hears == "at_once":
            wait_until(lambda: events.of("task_cancelled"), message="the worker to hear of it")
        else:
            wait_until(lambda: events.of("batch_released"), message="the guard's release")
        wait_until(lambda: held_slots(conn) == ["t0"], timeout=2,
                   message="t1's slot back while t0 still runs")
    finally:
        go_on.set()
        runner.join(10)
    assert ran == ["t0"]
    assert held_slots(conn) == []
    assert task_row(conn, "t1")["status"] == "CANCELLED"


def test_no_write_of_the_cancelled_claim_makes_the_task_pending_again(conn, make_worker):
    worker = make_worker(types=["echo"])
    add_task(conn, "t1")
    row = claim(conn, "worker-a")
    old = store.Claim("t1", "worker-a", row["lease_token"])
    assert store.cancel_task(conn, "t1") is True

    assert store.fail_attempt(conn, old, error="x", permanent=False, retry=NO_DELAY) is None
    assert store.release_task(conn, "t1", old.token) is False
    assert store.rescue_task(conn, "t1", old.token, error="x", retry=NO_DELAY) is None
    assert store.renew_lease(conn, old, lease_seconds=30) is False
    assert store.complete_task(conn, old) is False
    assert_stays_cancelled(conn, "t1", worker)


@pytest.mark.parametrize("final_status", ["COMPLETED", "FAILED", "CANCELLED"])
def test_cancelling_a_finished_task_changes_nothing(conn, final_status):
    add_task(conn, "t1")
    row = claim(conn, "worker-a")
    mine = store.Claim("t1", "worker-a", row["lease_token"])
    if final_status == "COMPLETED":
        assert store.complete_task(conn, mine)
    elif final_status == "FAILED":
        assert store.fail_attempt(conn, mine, error="x", permanent=True, retry=NO_DELAY)
    else:
        assert store.cancel_task(conn, "t1")
    before = task_row(conn, "t1")
    assert before["status"] == final_status

    assert store.cancel_task(conn, "t1") is False
    assert task_row(conn, "t1") == before


def test_cancelling_an_unknown_task_reports_false(conn):
    assert store.cancel_task(conn, "no-such-task") is False
