"""Task types paused fleet-wide: the claim of every worker skips them from its next statement,
expired leases included; resuming wakes idle workers with the triggers' notification."""

from __future__ import annotations

import json
import statistics
import time

import psycopg
import pytest

from conftest import wait_until
from supervisor import Client
from supervisor.config import RetryConfig
from supervisor.db import store
from supervisor.errors import UsageError
from worker_fixtures import add_task, expire_lease, looping, received, task_row

pytest_plugins = ["worker_fixtures"]


@pytest.fixture
def client(db_dsn):
    with Client(db_dsn) as owned:
        yield owned


def claim(conn, *types: str, limit: int = 10) -> list[str]:
    rows = store.claim_tasks(conn, worker_id="w", task_types=types, lease_seconds=30,
                             limit=limit)
    return [row["id"] for row in rows]


def test_a_paused_type_is_not_claimed_and_the_others_are(client, conn):
    add_task(conn, "echo-1", "echo", priority=9)
    add_task(conn, "record-1", "record")
    assert client.pause("echo") is True
    assert claim(conn, "echo", "record") == ["record-1"]
    assert claim(conn, "echo") == []
    assert task_row(conn, "echo-1")["status"] == "PENDING"
    assert client.resume("echo") is True
    assert claim(conn, "echo", "record") == ["echo-1"]


def test_an_expired_lease_of_a_paused_type_is_not_taken_over(client, conn):
    add_task(conn, "t1")
    assert claim(conn, "echo") == ["t1"]
    expire_lease(conn, "t1")
    client.pause("echo")
    assert claim(conn, "echo") == []
    # The reaper still returns it to the queue, where it waits like any task of its type.
    retry = RetryConfig(base_delay=0.0, max_delay=0.0, jitter=0.0)
    reaped = store.reap_expired_leases(conn, batch_size=10, retry=retry)
    assert [(r["id"], r["status"]) for r in reaped] == [("t1", "PENDING")]
    assert claim(conn, "echo") == []
    client.resume("echo")
    assert claim(conn, "echo") == ["t1"]


def test_a_claimed_task_of_a_type_paused_since_finishes_normally(client, conn):
    add_task(conn, "t1")
    row = store.claim_task(conn, worker_id="w", task_types=["echo"], lease_seconds=30)
    client.pause("echo")
    held = store.Claim("t1", "w", row["lease_token"])
    assert store.renew_lease(conn, held, lease_seconds=30)
    assert store.complete_task(conn, held)
    assert task_row(conn, "t1")["status"] == "COMPLETED"


def test_pausing_twice_keeps_the_first_pause_and_resuming_twice_changes_nothing(client):
    assert client.pause("echo", paused_by="ops@db1") is True
    (first,) = client.paused()
    assert client.pause("echo", paused_by="someone-else") is False
    assert client.paused() == [first]
    assert (first["task_type"], first["paused_by"], first["due_pending"]) == \
        ("echo", "ops@db1", 0)
    assert client.resume("echo") is True
    assert client.resume("echo") is False
    assert client.paused() == []


def test_paused_by_defaults_to_user_at_host(client):
    client.pause("echo")
    (pause,) = client.paused()
    user, _, host = pause["paused_by"].partition("@")
    assert user and host


def test_resume_notifies_like_the_triggers_only_for_due_tasks(client, conn, listener):
    client.pause("echo")
    client.submit_many([{"task_type": "echo"}] * 3 + [{"task_type": "echo", "delay": 600}])
    received(listener)  # the insert's own notification, which woke workers for nothing
    client.pause("record")
    client.resume("record")
    assert received(listener) == [], "pausing and resuming a type with nothing due is silent"
    client.resume("echo")
    assert received(listener) == [{"types": ["echo"], "due": 3, "delay": None,
                                   "schema": "public"}]


def test_a_resume_in_a_rolled_back_transaction_resumes_and_notifies_nothing(db_dsn, client,
                                                                           listener):
    client.pause("echo")
    client.submit("echo")
    received(listener)
    with psycopg.connect(db_dsn) as app:
        assert Client(app).resume("echo") is True
        app.rollback()
    assert received(listener) == []
    assert [p["task_type"] for p in client.paused()] == ["echo"]


def test_an_idle_worker_starts_a_resumed_types_tasks_at_once(client, conn, make_worker,
                                                            config_for, db_dsn):
    """The worker polls every 30 s: only the resume's notification, relayed here by hand as
    the daemon's relay would, can start the task within the test's deadline."""
    worker = make_worker(config_for(db_dsn, poll_interval=30.0), types=["record"])
    states: list[str] = []
    worker.on_title = states.append
    client.pause("record")
    add_task(conn, "r1", "record")
    with psycopg.connect(db_dsn, autocommit=True) as relay:
        relay.execute("LISTEN pgtaskd_tasks")
        with looping(worker):
            wait_until(lambda: "idle" in states, message="the worker to find nothing to claim")
            client.resume("record")
            (notice,) = list(relay.notifies(timeout=5, stop_after=1))
            assert json.loads(notice.payload)["types"] == ["record"]
            worker.on_wake()
            wait_until(lambda: task_row(conn, "r1")["status"] == "COMPLETED", timeout=5,
                       message="the resumed task to run")


def test_health_leaves_a_paused_types_old_tasks_out_and_lists_it(client, conn):
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) VALUES "
                 "('old-echo', 'n', 'echo', now() - interval '1 hour'), "
                 "('old-record', 'n', 'record', now() - interval '10 minutes'), "
                 "('new-record', 'n', 'record', now())")
    client.pause("echo")
    health = store.queue_health(conn, max_pending_age=300, lease_grace=15)
    assert (health["due_pending"], health["paused_due"], health["old_pending"]) == (2, 1, 1)
    assert 600 <= health["oldest_pending_age"] < 700, "the record task's, not the paused one's"
    assert health["paused_types"] == ["echo"]
    client.pause("record")
    health = store.queue_health(conn, max_pending_age=300, lease_grace=15)
    assert (health["due_pending"], health["paused_due"], health["old_pending"]) == (0, 3, 0)
    assert health["oldest_pending_age"] is None
    assert health["paused_types"] == ["echo", "record"]
    stats = client.stats()
    assert (stats["due_pending"], stats["paused_due_pending"]) == (0, 3)
    assert [(p["task_type"], p["due_pending"]) for p in stats["paused_types"]] == \
        [("echo", 1), ("record", 2)]


@pytest.mark.parametrize("call, task_type, message", [
    ("pause", "", "task_type: must not be empty"),
    ("pause", "t" * 10_000, "task_type: longer than 200 characters"),
    ("pause", "a\nb", "task_type: must not contain control"),
    ("pause", None, "task_type: must be a string"),
    ("resume", "", "task_type: must not be empty"),
    ("resume", 7, "task_type: must be a string"),
])
def test_bad_task_types_are_refused_before_anything_is_written(client, call, task_type,
                                                               message):
    with pytest.raises(UsageError, match=message):
        getattr(client, call)(task_type)
    assert client.paused() == []


def test_a_long_paused_by_is_refused(client):
    with pytest.raises(UsageError, match="paused_by: longer than 200"):
        client.pause("echo", paused_by="x" * 201)


def median_seconds(call, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        started = time.monotonic()
        call()
        times.append(time.monotonic() - started)
    return statistics.median(times)


def test_health_and_stats_cost_no_more_than_linear_in_paused_types(client, conn):
    """15.14: every due task was compared with every paused type (30,000 pauses, 20,000 due
    tasks: 21 s a health check, `stats` past 60 s). Here 3,000 pauses against 30, the same
    2,000 due tasks: a linear check costs about the same, a quadratic one about 100 times."""
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "SELECT 'due' || g, 'n', 'type' || g, now() - interval '1 hour' "
                 "- g * interval '1 second' FROM generate_series(1, 2000) g")
    conn.execute("ANALYZE tasks")

    def check():
        return store.queue_health(conn, max_pending_age=300, lease_grace=15)

    def pause(first: int, last: int) -> None:
        conn.execute("INSERT INTO task_type_pauses (task_type, paused_by) "
                     "SELECT 'type' || g, 't' FROM generate_series(%s::int, %s::int) g",
                     (first, last))
        conn.execute("ANALYZE task_type_pauses")

    pause(1, 30)
    base_check, base_stats = median_seconds(check), median_seconds(client.stats)
    health = check()
    assert (health["due_pending"], health["paused_due"], health["old_pending"]) == (1970, 30, 1970)
    pause(31, 3000)
    many_check, many_stats = median_seconds(check), median_seconds(client.stats)
    print(f"\nhealth check {base_check * 1000:.1f} ms with 30 pauses, {many_check * 1000:.1f} ms "
          f"with 3,000; stats {base_stats * 1000:.1f} ms, {many_stats * 1000:.1f} ms")
    health = check()
    assert (health["due_pending"], health["paused_due"], health["old_pending"]) == (0, 2000, 0)
    assert health["oldest_pending_age"] is None and len(health["paused_types"]) == 3000
    # The pauses themselves are 3,000 rows to read (and stats lists each one): a few ms.
    assert many_check < 3 * base_check + 0.03, (base_check, many_check)
    assert many_stats < 3 * base_stats + 0.1, (base_stats, many_stats)


def test_health_counts_past_the_cap_are_lower_bounds_and_the_age_stays_exact(client, conn):
    """With the oldest due tasks all paused and more of them than the cap, the check still
    finds the oldest task it must age (past them), and says which counts stopped."""
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "SELECT 'echo' || g, 'n', 'echo', now() - interval '2 hours' - g * interval '1 s' "
                 "FROM generate_series(1, 8) g")
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "SELECT 'old-record' || g, 'n', 'record', now() - interval '1 hour' "
                 "- g * interval '1 s' FROM generate_series(1, 3) g")
    conn.execute("INSERT INTO tasks (id, name, task_type) VALUES ('new-1', 'n', 'record'), "
                 "('new-2', 'n', 'record')")

    def check(cap):
        return store.queue_health(conn, max_pending_age=300, lease_grace=15, cap=cap)

    client.pause("echo")
    exact = check(20)
    assert (exact["due_pending"], exact["paused_due"], exact["old_pending"]) == (5, 8, 3)
    assert exact["not_exact"] == {}
    capped = check(5)
    assert 3603 <= capped["oldest_pending_age"] < 3700, "the oldest record task, past echo's"
    assert (capped["due_pending"], capped["paused_due"], capped["old_pending"]) == (0, 6, 1)
    assert capped["not_exact"] == {"due_pending": "at_least", "paused_due": "at_least",
                                   "old_pending": "at_least"}
    client.pause("record")
    none_left = check(5)
    assert none_left["oldest_pending_age"] is None and none_left["old_pending"] == 0
    assert none_left["not_exact"] == {"due_pending": "at_least", "paused_due": "at_least"}
    client.resume("echo")
    client.resume("record")
    unpaused = check(5)
    assert 7208 <= unpaused["oldest_pending_age"] < 7300
    assert (unpaused["due_pending"], unpaused["paused_due"], unpaused["old_pending"]) == (6, 0, 6)
    assert unpaused["not_exact"] == {"due_pending": "at_least", "old_pending": "at_least"}, \
        "with nothing paused, nothing paused is due: exactly"
