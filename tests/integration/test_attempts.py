"""Failed attempts (issue 17.1): every way a run fails leaves a record of how it ended, with
the traceback of a handler that raised; a success leaves none; the last 20 are kept; they go
with their task."""

from __future__ import annotations

import pytest

from conftest import make_config
from supervisor import Client
from supervisor.config import RetryConfig
from supervisor.db import store
from supervisor.errors import UsageError
from supervisor.worker.failures import MAX_TRACEBACK_BYTES
from worker_fixtures import add_task, expire_lease, run_until_idle, task_row

pytest_plugins = ["worker_fixtures"]

NO_DELAY = RetryConfig(base_delay=0.0, max_delay=0.0, jitter=0.0)


def attempts_of(conn, task_id: str) -> list[dict]:
    return store.failed_attempts(conn, task_id, limit=100)


def test_each_raised_exception_is_recorded_with_its_traceback_and_a_success_with_nothing(
        conn, make_worker):
    worker = make_worker(types=["fail", "echo"], batch_size=3)
    add_task(conn, "bad", task_type="fail", max_retries=1, payload={"message": "service down"})
    add_task(conn, "good", task_type="echo")

    run_until_idle(worker)

    assert task_row(conn, "bad")["status"] == "FAILED"
    first, second = attempts_of(conn, "bad")
    assert [first["attempt"], second["attempt"]] == [1, 2]
    for attempt in (first, second):
        assert attempt["outcome"] == "exception"
        assert attempt["worker_id"] == "worker-1"
        assert attempt["error_type"] == "RuntimeError"
        assert attempt["message"] == "service down"
        assert attempt["signal"] is None
        assert attempt["started_at"] <= attempt["ended_at"]
        lines = attempt["traceback"].splitlines()
        # From the handler's own frame on: pgtaskd's frames that called it are left out.
        assert lines[0] == "Traceback (most recent call last):"
        assert "basic.py" in lines[1] and "in fail" in lines[1], lines
        assert lines[-1] == "RuntimeError: service down"
    assert attempts_of(conn, "good") == []
    assert task_row(conn, "good")["status"] == "COMPLETED"


def test_a_permanent_failure_is_one_attempt_of_its_own_kind(conn, make_worker):
    worker = make_worker(types=["permanent"])
    add_task(conn, "t1", task_type="permanent", max_retries=3)

    run_until_idle(worker)

    (attempt,) = attempts_of(conn, "t1")
    assert (attempt["outcome"], attempt["error_type"], attempt["message"]) == (
        "permanent", "supervisor.errors.PermanentError", "cannot ever work")
    assert attempt["traceback"].endswith("supervisor.errors.PermanentError: cannot ever work\n")


def test_a_traceback_is_kept_to_16_kib_its_head_and_its_tail(conn, make_worker):
    worker = make_worker(types=["fail"])
    message = "x" * 100_000 + " the end"
    add_task(conn, "t1", task_type="fail", max_retries=0, payload={"message": message})

    run_until_idle(worker)

    (attempt,) = attempts_of(conn, "t1")
    stored = attempt["traceback"]
    assert len(stored.encode()) <= MAX_TRACEBACK_BYTES
    assert stored.startswith("Traceback (most recent call last):\n")
    assert stored.endswith("x the end\n")
    assert "bytes; the middle left out" in stored


def test_a_run_whose_lease_a_claim_takes_over_is_recorded_as_a_lost_lease(conn):
    add_task(conn, "t1", max_retries=1)
    store.claim_task(conn, worker_id="worker-a", task_types=["echo"], lease_seconds=30)
    expire_lease(conn, "t1")

    taken = store.claim_task(conn, worker_id="worker-b", task_types=["echo"], lease_seconds=30)

    assert taken["id"] == "t1"
    (attempt,) = attempts_of(conn, "t1")
    assert (attempt["attempt"], attempt["outcome"], attempt["worker_id"]) == (
        1, "lease_lost", "worker-a")
    assert attempt["message"] == "lease of worker worker-a expired: taken over by worker-b"
    assert attempt["traceback"] is None


def test_a_renewal_and_a_completion_record_nothing(conn):
    add_task(conn, "t1")
    row = store.claim_task(conn, worker_id="worker-a", task_types=["echo"], lease_seconds=30)
    claim = store.Claim("t1", "worker-a", row["lease_token"])
    assert store.renew_lease(conn, claim, lease_seconds=30)
    assert store.complete_task(conn, claim)
    assert attempts_of(conn, "t1") == []


def test_a_reaped_run_is_recorded_as_a_lost_lease(conn):
    add_task(conn, "t1", max_retries=0)
    store.claim_task(conn, worker_id="worker-a", task_types=["echo"], lease_seconds=30)
    expire_lease(conn, "t1")

    store.reap_expired_leases(conn, batch_size=10, retry=NO_DELAY)

    assert task_row(conn, "t1")["status"] == "FAILED"
    (attempt,) = attempts_of(conn, "t1")
    assert (attempt["attempt"], attempt["outcome"], attempt["worker_id"]) == (
        1, "lease_lost", "worker-a")
    assert "expired: the worker stopped renewing it" in attempt["message"]


def test_the_last_20_attempts_are_kept(conn, make_worker):
    worker = make_worker(types=["fail"])
    add_task(conn, "t1", task_type="fail", max_retries=24)

    run_until_idle(worker)

    assert task_row(conn, "t1")["attempts"] == 25
    kept = attempts_of(conn, "t1")
    assert [a["attempt"] for a in kept] == list(range(6, 26))
    assert conn.execute("SELECT count(*) FROM task_attempts").fetchone()[0] == 20
    with Client(conn) as client:
        assert [a["attempt"] for a in client.failed_attempts("t1", limit=3)] == [23, 24, 25]
        with pytest.raises(UsageError, match="^limit: must be at most 20"):
            client.failed_attempts("t1", limit=21)


def test_deleting_a_task_by_retention_or_by_hand_deletes_its_attempts(conn, make_worker):
    worker = make_worker(types=["fail"])
    for task_id in ("old", "kept", "by-hand"):
        add_task(conn, task_id, task_type="fail", max_retries=0)
    run_until_idle(worker)
    conn.execute("UPDATE tasks SET finished_at = now() - interval '2 days' WHERE id = 'old'")

    deleted = store.delete_finished_tasks(conn, status="FAILED", older_than_seconds=86400,
                                          batch_size=100)
    conn.execute("DELETE FROM tasks WHERE id = 'by-hand'")

    assert deleted == 1
    assert conn.execute("SELECT task_id FROM task_attempts").fetchall() == [("kept",)]


def test_a_cancelled_task_shows_no_error_of_an_earlier_attempt(conn, db_dsn, make_worker):
    worker = make_worker(config=make_config(db_dsn,
                                            retry={"base_delay": 3600, "max_delay": 3600}),
                         types=["fail"])
    add_task(conn, "t1", task_type="fail", max_retries=3, payload={"message": "flaky"})
    run_until_idle(worker)
    assert task_row(conn, "t1")["error_message"].startswith("RuntimeError: flaky")

    with Client(conn) as client:
        client.cancel("t1")

    stored = task_row(conn, "t1")
    assert (stored["status"], stored["error_message"]) == ("CANCELLED", None)
    (attempt,) = attempts_of(conn, "t1")
    assert attempt["message"] == "flaky", "the history keeps what the error was"
