"""Unique keys: at most one PENDING or RUNNING task per key, enforced by the database.

A second submit of a live key writes nothing and returns the holder's id with created=False,
alone, in a batch, inside a caller's transaction and under concurrency; finished tasks do not
hold their key; a retry that would make a second live holder is refused, naming the holder.
"""

from __future__ import annotations

import re
import threading

import psycopg
import pytest

from conftest import wait_until
from supervisor import Client
from supervisor.client import TaskStateError
from supervisor.db import store
from supervisor.errors import UsageError
from worker_fixtures import add_task, task_row

SUBMITTERS = 16


@pytest.fixture
def client(db_dsn):
    with Client(db_dsn) as owned:
        yield owned


def live_tasks(conn, key: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT id FROM tasks WHERE unique_key = %s AND status IN ('PENDING', 'RUNNING')",
        (key,))]


def finish(conn, task_id: str, status: str) -> None:
    conn.execute("UPDATE tasks SET status = %s, finished_at = now() WHERE id = %s",
                 (status, task_id))


def test_a_live_key_returns_its_holder_and_writes_nothing(client, conn):
    first = client.submit("echo", {"v": 1}, unique_key="refresh-7")
    again = client.submit("report", {"v": 2}, unique_key="refresh-7", priority=9)
    assert (first.created, again, again.created) == (True, first, False)
    row = task_row(conn, first)
    assert (row["unique_key"], row["task_type"], row["payload"], row["priority"]) == \
        ("refresh-7", "echo", {"v": 1}, 0)
    assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 1


def test_a_running_holder_keeps_its_key(client, conn):
    holder = client.submit("echo", unique_key="k")
    store.claim_task(conn, worker_id="w", task_types=["echo"], lease_seconds=30)
    assert task_row(conn, holder)["status"] == "RUNNING"
    again = client.submit("echo", unique_key="k")
    assert (again, again.created) == (holder, False)


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "CANCELLED"])
def test_a_finished_task_does_not_hold_its_key(client, conn, status):
    old = client.submit("echo", unique_key="k")
    finish(conn, old, status)
    new = client.submit("echo", unique_key="k")
    assert new.created and new != old
    assert live_tasks(conn, "k") == [new]
    assert task_row(conn, old)["unique_key"] == "k", "a finished task keeps its key to show"


def test_an_existing_id_wins_over_a_held_key(client, conn):
    client.submit("echo", task_id="holder", unique_key="k")
    client.submit("echo", task_id="done")
    finish(conn, "done", "COMPLETED")
    again = client.submit("echo", task_id="done", unique_key="k")
    assert (again, again.created) == ("done", False)
    assert live_tasks(conn, "k") == ["holder"]


def test_submit_many_a_key_twice_in_one_batch_is_created_by_its_first_copy(client, conn):
    client.submit("echo", task_id="held", unique_key="old")
    ids = client.submit_many([
        {"task_type": "echo", "unique_key": "new", "payload": {"copy": 1}},
        {"task_type": "echo"},
        {"task_type": "echo", "unique_key": "new", "payload": {"copy": 2}},
        {"task_type": "echo", "unique_key": "old"},
        {"task_type": "echo", "task_id": "mine", "unique_key": "new"},
    ])
    assert [i.created for i in ids] == [True, True, False, False, False]
    assert ids[2] == ids[0] and ids[3] == "held" and ids[4] == ids[0]
    assert task_row(conn, ids[0])["payload"] == {"copy": 1}
    assert task_row(conn, ids[1])["unique_key"] is None
    assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 3


def test_the_same_id_twice_with_different_keys_is_created_once(client, conn):
    ids = client.submit_many([{"task_type": "echo", "task_id": "t", "unique_key": "a"},
                              {"task_type": "echo", "task_id": "t", "unique_key": "b"}])
    assert [(i, i.created) for i in ids] == [("t", True), ("t", False)]
    assert task_row(conn, "t")["unique_key"] == "a"


def test_inside_a_callers_transaction_a_held_key_does_not_abort_it(db_dsn, conn):
    committed = Client(conn).submit("echo", unique_key="before")
    conn.execute("CREATE TABLE orders (id INT PRIMARY KEY)")
    with psycopg.connect(db_dsn) as app:  # not autocommit: the application's transaction
        app.execute("INSERT INTO orders VALUES (1)")
        borrowed = Client(app)
        mine = borrowed.submit("echo", unique_key="in-txn")
        assert borrowed.submit("echo", unique_key="in-txn") == mine
        held = borrowed.submit("echo", unique_key="before")
        assert (held, held.created) == (committed, False)
        app.execute("INSERT INTO orders VALUES (2)")  # the transaction is still usable
        assert app.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        app.commit()
    assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 2
    assert live_tasks(conn, "in-txn") == [mine]


def test_a_plain_insert_without_a_key_works_and_the_index_binds_plain_sql_too(conn):
    conn.execute("INSERT INTO tasks (id, name, task_type) VALUES ('a', 'n', 'echo'), "
                 "('b', 'n', 'echo')")
    assert task_row(conn, "a")["unique_key"] is None
    conn.execute("INSERT INTO tasks (id, name, task_type, unique_key) "
                 "VALUES ('c', 'n', 'echo', 'k')")
    with pytest.raises(psycopg.errors.UniqueViolation, match="tasks_live_unique_key_idx"):
        conn.execute("INSERT INTO tasks (id, name, task_type, unique_key) "
                     "VALUES ('d', 'n', 'echo', 'k')")


def test_sixteen_threads_submitting_one_key_at_once_make_one_task(db_dsn, conn):
    clients = [Client(db_dsn) for _ in range(SUBMITTERS)]
    for each in clients:
        each.get("warm-up")  # connected before the race starts
    start = threading.Barrier(SUBMITTERS)
    results, errors = [None] * SUBMITTERS, []

    def submit(n: int) -> None:
        try:
            start.wait(10)
            results[n] = clients[n].submit("echo", {"n": n}, unique_key="race")
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(SUBMITTERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for each in clients:
        each.close()
    assert not errors, errors
    (holder,) = live_tasks(conn, "race")
    assert set(results) == {holder}, "every caller gets the one task's id"
    assert sum(r.created for r in results) == 1


def test_a_holder_that_finishes_before_it_is_looked_up_frees_the_key(client, conn,
                                                                     monkeypatch):
    """The rare path: the insert found the key held, and the holder finished before the
    submit could name it. The key is free, so the submit inserts again."""
    holder = client.submit("echo", unique_key="k")
    look_up = store.find_submitted

    def holder_finishes_first(*args, **kwargs):
        finish(conn, holder, "COMPLETED")
        return look_up(*args, **kwargs)

    monkeypatch.setattr(store, "find_submitted", holder_finishes_first)
    new = client.submit("echo", unique_key="k")
    assert new.created and new != holder
    assert live_tasks(conn, "k") == [new]


@pytest.mark.parametrize("status", ["FAILED", "CANCELLED"])
def test_retrying_a_task_whose_key_is_held_again_is_refused_naming_the_holder(client, conn,
                                                                              status):
    old = client.submit("echo", task_id="old", unique_key="k")
    finish(conn, old, status)
    new = client.submit("echo", task_id="new", unique_key="k")
    with pytest.raises(TaskStateError, match=re.escape(
            "cannot retry task 'old': its unique_key 'k' is held by task 'new' (PENDING)")) as info:
        client.retry("old")
    assert info.value.status == status
    assert task_row(conn, "old")["status"] == status
    finish(conn, new, "COMPLETED")
    client.retry("old")
    assert live_tasks(conn, "k") == ["old"]


def test_a_retry_racing_a_submit_of_its_key_is_refused_and_the_transaction_goes_on(db_dsn,
                                                                                   conn):
    """The retry's guard cannot see a submit that commits while the retry runs; the index
    refuses the row then, and only a savepoint is undone, not the caller's transaction."""
    add_task(conn, "other")
    conn.execute("INSERT INTO tasks (id, name, task_type, unique_key, status, finished_at) "
                 "VALUES ('old', 'n', 'echo', 'k', 'FAILED', now())")
    outcome = {}
    with psycopg.connect(db_dsn) as racer, Client(db_dsn) as client:
        racer.execute("INSERT INTO tasks (id, name, task_type, unique_key) "
                      "VALUES ('racer', 'n', 'echo', 'k')")  # uncommitted

        def retry_in_a_transaction() -> None:
            with client.transaction():
                client.cancel("other")
                try:
                    client.retry("old")
                except TaskStateError as exc:
                    outcome["refused"] = str(exc)

        thread = threading.Thread(target=retry_in_a_transaction)
        thread.start()
        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'").fetchone()[0] > 0,
            message="the retry to wait for the racing submit")
        racer.commit()
        thread.join(30)
    assert outcome["refused"].endswith("is held by task 'racer' (PENDING); retry it once "
                                       "that task has finished")
    assert task_row(conn, "old")["status"] == "FAILED"
    assert task_row(conn, "other")["status"] == "CANCELLED", "the transaction committed"


@pytest.mark.parametrize("key, message", [
    ("", "unique_key: must not be empty"),
    (" padded", "unique_key: must not start or end with white space"),
    ("a\nb", "unique_key: must not contain control"),
    ("\u200bzero-width", "unique_key: must not contain control or format"),
    ("k" * 201, "unique_key: longer than 200 characters"),
    ("k" * 10_000, "unique_key: longer than 200 characters"),
    (42, "unique_key: must be a string, got a number"),
    ("a\x00b", "unique_key: must not contain NUL"),
])
def test_bad_keys_are_refused_in_one_line_before_anything_is_written(client, conn, key,
                                                                     message):
    with pytest.raises(UsageError) as info:
        client.submit("echo", unique_key=key)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
    assert len(str(info.value)) < 200
    with pytest.raises(UsageError, match=re.escape(f"tasks[1]: {message}")):
        client.submit_many([{"task_type": "echo"}, {"task_type": "echo", "unique_key": key}])
    assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0
