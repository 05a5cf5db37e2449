"""Retries kept in the database: how many runs, and how long between them."""

from __future__ import annotations

import pytest

from conftest import make_config
from worker_fixtures import add_task, recorded_runs, run_until_idle, task_row

pytest_plugins = ["worker_fixtures"]


def backoff_seconds(conn, retry_count, base, cap, jitter) -> float:
    return conn.execute("SELECT extract(epoch FROM pgtaskd_backoff(%s, %s, %s, %s))::float8",
                        (retry_count, base, cap, jitter)).fetchone()[0]


def test_a_task_that_always_fails_runs_max_retries_plus_one_times(conn, make_worker):
    worker = make_worker(types=["fail"])
    add_task(conn, "t1", task_type="fail", max_retries=3, payload={"message": "service down"})

    outcomes = run_until_idle(worker)

    assert [o.name for o in outcomes] == ["retried", "retried", "retried", "failed"]
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["retry_count"], stored["attempts"]) == ("FAILED", 3, 4)
    assert [run[2] for run in recorded_runs(conn, "t1")] == [0, 1, 2, 3]
    assert stored["error_message"].startswith("RuntimeError: service down")
    assert "basic.py" in stored["error_message"], "the error should say where the handler raised"
    assert stored["claimed_by"] is None and stored["lease_until"] is None
    assert stored["finished_at"] is not None


def test_a_permanent_error_fails_the_task_at_once(conn, make_worker):
    worker = make_worker(types=["permanent"])
    add_task(conn, "t1", task_type="permanent", max_retries=3)

    outcomes = run_until_idle(worker)

    assert [o.name for o in outcomes] == ["failed"]
    assert len(recorded_runs(conn, "t1")) == 1
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["retry_count"]) == ("FAILED", 0)
    assert stored["error_message"] == "PermanentError: cannot ever work"


def test_max_retries_zero_means_a_single_run(conn, make_worker):
    worker = make_worker(types=["fail"])
    add_task(conn, "t1", task_type="fail", max_retries=0)
    assert [o.name for o in run_until_idle(worker)] == ["failed"]
    assert len(recorded_runs(conn, "t1")) == 1


def test_backoff_doubles_from_the_base_up_to_the_cap(conn):
    delays = [backoff_seconds(conn, n, 2.0, 600.0, 0.0) for n in range(12)]
    assert delays == [2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600, 600]
    # A retry count far past any float's exponent still gives the cap, not an overflow.
    assert backoff_seconds(conn, 100_000, 2.0, 600.0, 0.0) == 600


def test_backoff_jitter_adds_up_to_its_fraction_and_no_more(conn):
    samples = [row[0] for row in conn.execute(
        "SELECT extract(epoch FROM pgtaskd_backoff(3, 1.0, 100.0, 0.5))::float8 "
        "FROM generate_series(1, 4000)")]
    assert all(8.0 <= s <= 12.0 for s in samples), (min(samples), max(samples))
    # With 4000 uniform draws both ends of the range are all but certain to be reached.
    assert min(samples) < 8.2 and max(samples) > 11.8, (min(samples), max(samples))
    capped = [row[0] for row in conn.execute(
        "SELECT extract(epoch FROM pgtaskd_backoff(10, 1.0, 100.0, 0.5))::float8 "
        "FROM generate_series(1, 1000)")]
    assert all(100.0 <= s <= 150.0 for s in capped), (min(capped), max(capped))


def test_retry_delays_grow_to_the_configured_cap(conn, db_dsn, make_worker):
    config = make_config(db_dsn, retry={"base_delay": 5.0, "max_delay": 40.0, "jitter": 0.0})
    worker = make_worker(config, types=["fail"])
    add_task(conn, "t1", task_type="fail", max_retries=7)

    scheduled_delays, reported_delays = [], []
    for _ in range(7):
        outcome = worker.run_once()
        assert outcome is not None and outcome.name == "retried"
        stored = task_row(conn, "t1")
        assert stored["status"] == "PENDING"
        scheduled_delays.append((stored["scheduled_time"] - stored["updated_at"]).total_seconds())
        reported_delays.append(outcome.retry_delay)
        assert worker.run_once() is None, "a task ran again before its retry delay"
        # Move the clock to the retry time rather than sleeping through the delay.
        conn.execute("UPDATE tasks SET scheduled_time = now() WHERE id = 't1'")

    assert scheduled_delays == pytest.approx([5, 10, 20, 40, 40, 40, 40], abs=0.001)
    assert reported_delays == pytest.approx([5, 10, 20, 40, 40, 40, 40], abs=0.1)
    assert worker.run_once().name == "failed"
    assert task_row(conn, "t1")["retry_count"] == 7


def test_retry_delay_with_jitter_stays_within_its_fraction(conn, db_dsn, make_worker):
    config = make_config(db_dsn, retry={"base_delay": 10.0, "max_delay": 100.0, "jitter": 0.5})
    worker = make_worker(config, types=["fail"])
    add_task(conn, "t1", task_type="fail", max_retries=5)
    assert worker.run_once().name == "retried"
    stored = task_row(conn, "t1")
    delay = (stored["scheduled_time"] - stored["updated_at"]).total_seconds()
    assert 10.0 <= delay <= 15.0
