"""The triggers that notify pgtaskd_tasks when work becomes due (migration 0002).

A listening connection of the test's own counts what arrives. Whatever a client inserts, the
trigger must never make its INSERT or UPDATE fail: pg_notify refuses payloads of 8000 bytes
or more, and infinite timestamps have no epoch.
"""

from __future__ import annotations


import psycopg

from supervisor import Client
from supervisor.config import RetryConfig
from supervisor.db import store
from supervisor.db.migrate import migrate
from worker_fixtures import add_task, received

pytest_plugins = ["worker_fixtures"]


def test_a_submit_many_of_ten_thousand_sends_one_notification(conn, listener):
    Client(conn).submit_many({"task_type": "echo" if n % 2 else "record"} for n in range(10_000))
    (notice,) = received(listener)
    assert notice["due"] == 10_000
    assert sorted(notice["types"]) == ["echo", "record"]
    assert notice["delay"] is None and notice["schema"] == "public"


def test_a_plain_insert_from_any_client_notifies(conn, listener):
    conn.execute("INSERT INTO tasks (id, name, task_type) VALUES ('raw', 'raw', 'echo')")
    assert received(listener) == [{"types": ["echo"], "due": 1, "delay": None,
                                   "schema": "public"}]


def test_a_future_task_notifies_its_delay(conn, listener):
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "VALUES ('later', 'n', 'echo', now() + interval '90 seconds')")
    (notice,) = received(listener)
    assert notice["due"] == 0 and 89 < notice["delay"] <= 90


def test_a_retry_and_a_release_notify_but_claims_renewals_and_completions_do_not(conn,
                                                                                 listener):
    add_task(conn, "t1")
    add_task(conn, "t2")
    received(listener)
    rows = store.claim_tasks(conn, worker_id="w", task_types=["echo"], lease_seconds=30, limit=2)
    claims = [store.Claim(r["id"], "w", r["lease_token"]) for r in rows]
    store.renew_leases(conn, claims, lease_seconds=30)
    store.complete_tasks(conn, claims[:1])
    assert received(listener) == []

    retry = RetryConfig(base_delay=30.0, max_delay=60.0, jitter=0.0)
    store.fail_attempt(conn, claims[1], error="x", permanent=False, retry=retry)
    (notice,) = received(listener)
    assert notice["types"] == ["echo"] and notice["due"] == 0
    assert 29 < notice["delay"] <= 30


def test_no_insert_fails_for_its_notification(conn, listener):
    long_type = "t" * 5000
    control = "\x01" * 3000  # JSON-escaped six times longer
    conn.execute("INSERT INTO tasks (id, name, task_type) VALUES ('a', 'n', %s), ('b', 'n', %s)",
                 (long_type, control))
    (notice,) = received(listener)
    assert notice["types"] is None and notice["due"] == 2, "too long to list: 'any type'"
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) VALUES "
                 "('minus', 'n', 'echo', '-infinity'), ('plus', 'n', 'echo', 'infinity')")
    (notice,) = received(listener)
    assert notice["due"] == 1 and notice["delay"] is None
    conn.execute("UPDATE tasks SET scheduled_time = 'infinity' WHERE id = 'minus'")
    conn.execute("INSERT INTO tasks (id, name, task_type, status) "
                 "VALUES ('done', 'n', 'echo', 'COMPLETED')")
    assert all(n["delay"] is None and n["due"] == 0 for n in received(listener))


def test_an_insert_that_adds_nothing_sends_nothing(conn, listener):
    add_task(conn, "dup")
    received(listener)
    created = Client(conn).submit("echo", task_id="dup")
    assert created.created is False
    assert received(listener) == []


def test_a_notification_names_the_schema_of_its_table(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA other")
        conn.execute("SET search_path = other")
        migrate(conn)
        conn.execute("LISTEN pgtaskd_tasks")
        conn.execute("INSERT INTO other.tasks (id, name, task_type, scheduled_time) "
                     "VALUES ('x', 'n', 'echo', now() - interval '1 s')")
        (notice,) = received(conn)
        assert notice["schema"] == "other"
