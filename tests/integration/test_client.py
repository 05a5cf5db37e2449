"""The Python client against a real PostgreSQL: submit, idempotency, transactions, inspection."""

from __future__ import annotations

import pickle
import re
import socket
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from conftest import make_config, scratch_database
from supervisor import Client
from supervisor.client import SubmittedId
from supervisor.db import loaders, store
from supervisor.errors import OperationalError, UsageError
from worker_fixtures import add_task, task_row

CONCURRENT_SUBMITTERS = 8


@pytest.fixture
def client(db_dsn):
    with Client(db_dsn) as owned:
        yield owned


@pytest.fixture(scope="module")
def untouched_dsn(pg_admin_dsn, template_db):
    """One database for the tests whose point is that nothing is written: cloning a database
    per case would cost more than the cases."""
    with scratch_database(pg_admin_dsn, "pgtaskd_u", template_db) as dsn:
        yield dsn


@pytest.fixture
def untouched(untouched_dsn):
    """A client and a connection on the shared database, which must stay without tasks."""
    with Client(untouched_dsn, max_payload_bytes=100) as small, \
            psycopg.connect(untouched_dsn, autocommit=True) as watcher:
        yield small
        assert task_count(watcher) == 0, "a refused call wrote a task"


def task_count(conn) -> int:
    return conn.execute("SELECT count(*) FROM tasks").fetchone()[0]


def set_status(conn, task_id: str, status: str, **fields) -> None:
    """Put a task into a state directly, as the worker would have left it."""
    assignments = ", ".join(f"{column} = %({column})s" for column in fields)
    conn.execute(f"UPDATE tasks SET status = %(status)s{', ' if fields else ''}{assignments} "
                 f"WHERE id = %(task_id)s", {"status": status, "task_id": task_id, **fields})


def test_submit_stores_a_due_pending_task_under_a_new_uuid(client, conn):
    task_id = client.submit("echo", {"text": "hi", "n": [1, 2.5, None, True]})
    assert uuid.UUID(task_id).version == 4
    assert task_id.created is True
    row = task_row(conn, task_id)
    assert row["status"] == "PENDING"
    assert (row["task_type"], row["name"]) == ("echo", "echo")
    assert row["payload"] == {"text": "hi", "n": [1, 2.5, None, True]}
    assert (row["priority"], row["retry_count"], row["max_retries"]) == (0, 0, 3)
    assert row["scheduled_time"] == row["created_at"], "due at once, by the database's clock"


def test_submit_keeps_every_option(client, conn):
    run_at = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    task_id = client.submit("report", priority=-7, run_at=run_at, task_id="report-may",
                            name="May report", max_retries=0)
    assert task_id == "report-may"
    row = task_row(conn, "report-may")
    assert (row["name"], row["priority"], row["max_retries"], row["payload"]) == \
        ("May report", -7, 0, {})
    assert row["scheduled_time"] == run_at


@pytest.mark.parametrize("delay", [90, 90.0, timedelta(seconds=90)])
def test_a_delay_counts_from_the_database_clock(client, conn, delay):
    task_id = client.submit("echo", delay=delay)
    row = task_row(conn, task_id)
    assert row["scheduled_time"] - row["created_at"] == timedelta(seconds=90)


def test_submitting_an_existing_id_writes_nothing_and_says_so(client, conn):
    first = client.submit("echo", {"v": 1}, task_id="order-42")
    again = client.submit("report", {"v": 2}, task_id="order-42", priority=9)
    assert (first, first.created) == ("order-42", True)
    assert (again, again.created) == ("order-42", False)
    row = task_row(conn, "order-42")
    assert (row["task_type"], row["payload"], row["priority"]) == ("echo", {"v": 1}, 0)
    assert task_count(conn) == 1


def test_submitting_an_existing_id_of_a_finished_task_does_not_run_it_again(client, conn):
    client.submit("echo", task_id="once")
    set_status(conn, "once", "COMPLETED")
    assert client.submit("echo", task_id="once").created is False
    assert task_row(conn, "once")["status"] == "COMPLETED"


def test_submitted_id_is_a_plain_string_that_survives_pickling():
    task_id = SubmittedId("abc", False)
    assert task_id == "abc" and isinstance(task_id, str) and {task_id: 1}["abc"] == 1
    copy = pickle.loads(pickle.dumps(task_id))
    assert (copy, copy.created) == ("abc", False)


def test_submit_many_inserts_thousands_in_one_statement(client, conn):
    client.submit("echo", task_id="old-7")
    specs = [{"task_type": "echo", "payload": {"n": n}, "task_id": f"old-{n}" if n < 10 else None}
             for n in range(5000)]
    ids = client.submit_many(specs)
    assert len(ids) == 5000
    assert [i.created for i in ids[:10]] == [n != 7 for n in range(10)]
    assert all(i.created for i in ids[10:])
    assert task_count(conn) == 5000
    # The client's connection is autocommit: one transaction means one statement, and every
    # row of one transaction carries the same now().
    assert conn.execute("SELECT count(DISTINCT created_at) FROM tasks "
                        "WHERE id <> 'old-7'").fetchone()[0] == 1
    assert task_row(conn, "old-3")["payload"] == {"n": 3}


def test_submit_many_creates_an_id_given_twice_once_by_its_first_copy(client, conn):
    ids = client.submit_many([{"task_type": "echo", "task_id": "dup", "payload": {"copy": 1}},
                              {"task_type": "echo", "task_id": "dup", "payload": {"copy": 2}}])
    assert [i.created for i in ids] == [True, False]
    assert task_row(conn, "dup")["payload"] == {"copy": 1}


def test_submit_many_with_every_option_and_an_empty_batch(client, conn):
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    client.submit_many([
        {"task_type": "a", "task_id": "a", "priority": 5, "run_at": at, "name": "A",
         "max_retries": 1},
        {"task_type": "b", "task_id": "b", "delay": 30},
    ])
    a, b = task_row(conn, "a"), task_row(conn, "b")
    assert (a["priority"], a["scheduled_time"], a["name"], a["max_retries"]) == (5, at, "A", 1)
    assert b["scheduled_time"] - b["created_at"] == timedelta(seconds=30)
    assert client.submit_many([]) == []


@pytest.mark.parametrize("spec, message", [
    ({"payload": {}}, "tasks[1]: task_type is missing"),
    ({"task_type": "echo", "colour": "red"}, "tasks[1]: unknown field 'colour'"),
    ({"task_type": "echo", "payload": [1]}, "tasks[1]: payload: must be a JSON object"),
    ("echo", "tasks[1]: must be a mapping"),
])
def test_one_bad_task_rejects_the_whole_batch(untouched, spec, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        untouched.submit_many([{"task_type": "echo"}, spec])


def _cyclic():
    value: dict = {}
    value["self"] = value
    return value


def _nested(depth: int):
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("arguments, message", [
    ({"payload": [1, 2]}, "payload: must be a JSON object"),
    ({"payload": "text"}, "payload: must be a JSON object"),
    ({"payload": {"x": float("nan")}}, "payload: cannot be stored as JSON"),
    ({"payload": {"x": float("inf")}}, "payload: cannot be stored as JSON"),
    ({"payload": {"x": object()}}, "payload: cannot be stored as JSON"),
    ({"payload": {"x": ["a\x00b"]}}, "NUL"),
    ({"payload": {"a\x00": 1}}, "NUL"),
    ({"payload": {1: "one"}}, "keys must be strings"),
    ({"payload": {"x": "\ud800"}}, "not valid Unicode"),
    ({"payload": _nested(5000)}, "nested too deeply"),
    ({"payload": _cyclic()}, "Circular reference"),
    ({"payload": {"x": "y" * 200}}, "more than the maximum of 100"),
    ({"run_at": datetime(2030, 1, 1)}, "has no time zone"),
    ({"run_at": "2030-01-01T00:00:00Z"}, "must be a datetime"),
    ({"run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))}, "out of range"),
    ({"run_at": datetime.now(timezone.utc), "delay": 5}, "not both"),
    ({"delay": -1}, "delay: must be from 0"),
    ({"delay": float("nan")}, "delay: must be from 0"),
    ({"delay": 10**12}, "delay: must be from 0"),
    ({"delay": "5m"}, "delay: must be seconds"),
    ({"max_retries": -1}, "max_retries: must be 0 or more"),
    ({"max_retries": 2.5}, "max_retries: must be a whole number"),
    ({"priority": True}, "priority: must be a whole number"),
    ({"priority": 2**31}, "priority: must be at most"),
    ({"task_id": ""}, "task_id: must not be empty"),
    ({"task_id": " padded"}, "white space"),
    ({"task_id": "a\nb"}, "control"),
    ({"task_id": "x" * 201}, "longer than 200"),
    ({"task_id": 42}, "task_id: must be a string"),
    ({"name": "a\x00b"}, "name: must not contain NUL"),
    ({"name": "n" * 1001}, "name: longer than"),
])
def test_bad_input_raises_usage_error_and_writes_nothing(untouched, arguments, message):
    with pytest.raises(UsageError, match=message):
        untouched.submit("echo", **arguments)


@pytest.mark.parametrize("task_type, message", [
    ("", "must not be empty"), ("\x1b[31mred", "must not contain control"),
    (None, "must be a string"),
])
def test_bad_task_types_are_refused(untouched, task_type, message):
    with pytest.raises(UsageError, match=f"task_type: {message}"):
        untouched.submit(task_type)


def test_the_payload_limit_counts_utf8_bytes_of_the_stored_json(db_dsn, conn):
    with Client(db_dsn, max_payload_bytes=20) as small:
        small.submit("echo", {"x": "é" * 6})  # {"x":"éééééé"} is 20 bytes
        with pytest.raises(UsageError, match="21 bytes, more than the maximum of 20"):
            small.submit("echo", {"x": "é" * 6 + "a"})
    assert task_count(conn) == 1


def test_from_config_takes_the_dsn_and_the_payload_limit_from_the_config(db_dsn, conn):
    config = make_config(db_dsn, max_payload_bytes=64)
    with Client.from_config(config) as configured:
        assert configured.max_payload_bytes == 64
        configured.submit("echo", task_id="via-config")
        with pytest.raises(UsageError, match="maximum of 64"):
            configured.submit("echo", {"x": "y" * 64})
    assert task_row(conn, "via-config")["status"] == "PENDING"



class _Abort(Exception):
    pass


def test_submit_in_a_rolled_back_application_transaction_leaves_no_task(db_dsn, conn):
    conn.execute("CREATE TABLE orders (id INT PRIMARY KEY)")
    with psycopg.connect(db_dsn, autocommit=True) as app:
        with pytest.raises(_Abort):
            with app.transaction():
                app.execute("INSERT INTO orders VALUES (1)")
                Client(app).submit("ship", {"order": 1}, task_id="ship-1")
                assert task_count(conn) == 0, "visible before the application committed"
                raise _Abort
    assert task_count(conn) == 0
    assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 0


def test_submit_in_a_committed_application_transaction_lands_with_its_writes(db_dsn, conn):
    conn.execute("CREATE TABLE orders (id INT PRIMARY KEY)")
    with psycopg.connect(db_dsn) as app:  # not autocommit: psycopg opens the transaction
        app.execute("INSERT INTO orders VALUES (1)")
        Client(app).submit("ship", task_id="ship-1")
        app.commit()
        app.execute("INSERT INTO orders VALUES (2)")
        Client(app).submit_many([{"task_type": "ship", "task_id": "ship-2"}])
        app.rollback()
    assert [r[0] for r in conn.execute("SELECT id FROM tasks")] == ["ship-1"]
    assert conn.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


def test_a_borrowed_connection_is_left_open_and_uncommitted(db_dsn, conn):
    with psycopg.connect(db_dsn) as app:
        with Client(app) as borrowed:
            borrowed.submit("echo", task_id="t1")
        assert not app.closed
        assert app.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        app.rollback()
    assert task_count(conn) == 0


def test_client_transaction_groups_calls_all_or_nothing(client, conn):
    add_task(conn, "pending")
    with pytest.raises(_Abort):
        with client.transaction():
            client.submit("echo", task_id="new")
            client.cancel("pending")
            raise _Abort
    assert task_count(conn) == 1 and task_row(conn, "pending")["status"] == "PENDING"
    with client.transaction():
        client.submit("echo", task_id="new")
        client.cancel("pending")
    assert task_row(conn, "pending")["status"] == "CANCELLED" and task_count(conn) == 2


# Each submitter connects first, then waits for the word "go" on stdin, so that all of them
# send their INSERT within a few milliseconds of each other.
SUBMITTER = """
import sys
from supervisor import Client
client = Client(sys.argv[1])
client.get("warm-up")
print("ready", flush=True)
sys.stdin.readline()
print(client.submit("echo", task_id=sys.argv[2]).created, flush=True)
"""


def test_processes_submitting_one_id_at_once_create_one_task(db_dsn, conn):
    submitters = [subprocess.Popen([sys.executable, "-c", SUBMITTER, db_dsn, "same-id"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                  for _ in range(CONCURRENT_SUBMITTERS)]
    try:
        for submitter in submitters:
            assert submitter.stdout.readline().strip() == "ready"
        for submitter in submitters:
            submitter.stdin.write("go\n")
            submitter.stdin.flush()
        created = [submitter.stdout.readline().strip() for submitter in submitters]
        for submitter in submitters:
            assert submitter.wait(timeout=30) == 0
    finally:
        for submitter in submitters:
            if submitter.poll() is None:
                submitter.kill()
    assert sorted(created) == ["False"] * (CONCURRENT_SUBMITTERS - 1) + ["True"]
    assert task_count(conn) == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_database_is_one_line_without_the_password():
    port = free_port()
    unreachable = Client(f"postgresql://app:s3cret@127.0.0.1:{port}/tasks", connect_timeout=2)
    with pytest.raises(OperationalError) as info:
        unreachable.submit("echo")
    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "s3cret" not in message
    assert "\n" not in message


def test_a_database_without_the_schema_says_to_migrate(empty_db_dsn):
    with Client(empty_db_dsn) as bare, pytest.raises(OperationalError, match="pgtaskd migrate"):
        bare.submit("echo")


def test_an_owned_connection_that_broke_is_reopened(client, conn):
    client.submit("echo", task_id="before")
    backend = client._connection().info.backend_pid
    conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
    with pytest.raises(OperationalError, match="lost the connection"):
        client.get("before")
    assert client.get("before")["id"] == "before"
    assert client._connection().info.backend_pid != backend


def test_a_payload_python_cannot_read_comes_back_as_its_stored_text(db_dsn, conn):
    conn.execute("INSERT INTO tasks (id, name, task_type, payload) VALUES "
                 "('huge', 'huge', 'echo', %s::jsonb)", ('{"n": ' + "7" * 5000 + "}",))
    stored = conn.execute("SELECT payload::text FROM tasks").fetchone()[0]
    with Client(db_dsn) as client:
        payload = client.get("huge")["payload"]
        listed = client.list()
    assert isinstance(payload, loaders.StoredJson) and payload == stored
    assert "4300 digits" in payload.reason
    assert [(task["id"], task["payload"]) for task in listed] == [("huge", stored)]
