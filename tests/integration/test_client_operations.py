"""The Python client operating on tasks against a real PostgreSQL: cancel, retry, get, list
and stats."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from supervisor.client import TaskNotFound, TaskStateError
from supervisor.db import store
from supervisor.errors import OperationalError, UsageError
from worker_fixtures import add_task, task_row

from test_client import client, set_status, untouched, untouched_dsn  # noqa: F401


def test_cancel_ends_a_pending_task(client, conn):
    add_task(conn, "t1")
    client.cancel("t1")
    row = task_row(conn, "t1")
    assert row["status"] == "CANCELLED" and row["finished_at"] is not None


def test_cancel_ends_a_running_task_and_drops_its_claim(client, conn):
    add_task(conn, "t1")
    store.claim_task(conn, worker_id="w1", task_types=["echo"], lease_seconds=30)
    client.cancel("t1")
    row = task_row(conn, "t1")
    assert (row["status"], row["claimed_by"], row["lease_until"]) == ("CANCELLED", None, None)


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "CANCELLED"])
def test_cancel_refuses_a_finished_task_naming_its_status(client, conn, status):
    add_task(conn, "t1")
    set_status(conn, "t1", status, finished_at=datetime(2026, 1, 1, tzinfo=timezone.utc))
    with pytest.raises(TaskStateError, match=f"cannot cancel task 't1': it is {status}") as info:
        client.cancel("t1")
    assert (info.value.task_id, info.value.status) == ("t1", status)
    assert task_row(conn, "t1")["status"] == status


def test_cancel_and_retry_of_a_missing_task_raise_task_not_found(client):
    with pytest.raises(TaskNotFound, match="no task with id 'ghost'"):
        client.cancel("ghost")
    with pytest.raises(TaskNotFound):
        client.retry("ghost")
    assert isinstance(TaskNotFound("x"), OperationalError)


@pytest.mark.parametrize("status", ["FAILED", "CANCELLED"])
def test_retry_puts_a_finished_task_back_with_a_fresh_budget(client, conn, status):
    add_task(conn, "t1", max_retries=2)
    set_status(conn, "t1", status, retry_count=2, error_message="boom", claimed_by=None,
               finished_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
               scheduled_time=datetime(2040, 1, 1, tzinfo=timezone.utc))
    client.retry("t1")
    row = task_row(conn, "t1")
    assert (row["status"], row["retry_count"], row["error_message"]) == ("PENDING", 0, None)
    assert (row["claimed_by"], row["lease_until"], row["finished_at"]) == (None, None, None)
    now = conn.execute("SELECT now()").fetchone()[0]
    assert row["scheduled_time"] <= now, "due at once"
    assert row["max_retries"] == 2


@pytest.mark.parametrize("status", ["PENDING", "RUNNING", "COMPLETED"])
def test_retry_refuses_a_task_that_did_not_fail(client, conn, status):
    add_task(conn, "t1")
    set_status(conn, "t1", status, claimed_by="w1" if status == "RUNNING" else None)
    with pytest.raises(TaskStateError, match=f"cannot retry task 't1': it is {status}"):
        client.retry("t1")
    assert task_row(conn, "t1")["status"] == status


def test_get_returns_every_column_or_none(client, conn):
    add_task(conn, "t1", payload={"k": "v"})
    row = client.get("t1")
    assert row == task_row(conn, "t1")
    assert {"id", "payload", "status", "lease_token", "attempts", "finished_at"} <= set(row)
    assert client.get("nope") is None


def test_list_filters_by_status_and_type_newest_update_first(client, conn):
    for task_id, task_type in [("a", "echo"), ("b", "report"), ("c", "echo"), ("d", "echo")]:
        add_task(conn, task_id, task_type)
    set_status(conn, "c", "FAILED")
    conn.execute("UPDATE tasks SET updated_at = now() + (ascii(id) - 96) * interval '1 second'")
    assert [t["id"] for t in client.list()] == ["d", "c", "b", "a"]
    assert [t["id"] for t in client.list(status="pending")] == ["d", "b", "a"]
    assert [t["id"] for t in client.list(status="PENDING", task_type="echo")] == ["d", "a"]
    assert [t["id"] for t in client.list(limit=2)] == ["d", "c"]
    assert client.list(task_type="nothing") == []


@pytest.mark.parametrize("arguments, message", [
    ({"status": "DONE"}, "unknown status 'DONE'"),
    ({"status": 3}, "unknown status 3"),
    ({"limit": 0}, "limit: must be 1 or more"),
    ({"limit": 10_001}, "limit: must be at most 10000"),
])
def test_list_refuses_bad_filters(untouched, arguments, message):
    with pytest.raises(UsageError, match=message):
        untouched.list(**arguments)


def test_stats_counts_by_status_and_type_with_ages_and_expired_leases(client, conn):
    for task_id, task_type in [("a", "echo"), ("b", "echo"), ("c", "report"), ("d", "echo")]:
        add_task(conn, task_id, task_type)
    conn.execute("UPDATE tasks SET scheduled_time = now() - interval '60 seconds' WHERE id = 'a'")
    set_status(conn, "b", "COMPLETED")
    store.claim_task(conn, worker_id="w1", task_types=["report"], lease_seconds=30)
    conn.execute("UPDATE tasks SET lease_until = now() - interval '1 second' WHERE id = 'c'")
    stats = client.stats()
    assert stats["total"] == 4
    assert stats["by_status"] == {"PENDING": 2, "RUNNING": 1, "COMPLETED": 1, "FAILED": 0,
                                  "CANCELLED": 0}
    assert stats["by_type"]["echo"] == {"PENDING": 2, "RUNNING": 0, "COMPLETED": 1,
                                        "FAILED": 0, "CANCELLED": 0}
    assert stats["by_type"]["report"]["RUNNING"] == 1
    assert stats["due_pending"] == 2
    assert 60 <= stats["oldest_pending_age"] < 70
    assert stats["expired_leases"] == 1


def test_stats_of_an_empty_queue(client):
    stats = client.stats()
    assert stats["total"] == 0 and stats["by_type"] == {}
    assert stats["oldest_pending_age"] is None and stats["expired_leases"] == 0
