"""A rolling upgrade: a newer pgtaskd migrates the shared database while this one runs."""

from __future__ import annotations

import psycopg
import pytest

from conftest import add_task, task_row, wait_until
from supervisor.db.migrate import available_migrations
from supervisor.errors import EXIT_SCHEMA

pytest_plugins = ["daemon"]


def test_a_daemon_stops_claiming_once_the_schema_is_newer_than_it_knows(start_daemon, db_dsn,
                                                                        conn):
    # Before: nothing looked at the schema's version after start, so a daemon claimed on
    # through an upgrade that, like the limits' slots, added a rule old code does not keep.
    daemon = start_daemon(pools={"default": {"processes": 2, "batch_size": 3}})
    add_task(conn, "running", "sleep", {"seconds": 2}, max_retries=0)
    wait_until(lambda: task_row(conn, "running")["status"] == "RUNNING",
               message="the task to start")
    newer = max(m.version for m in available_migrations()) + 1
    conn.execute("INSERT INTO pgtaskd_schema_migrations (version, name) "
                 "VALUES (%s, 'slots_for_everyone')", (newer,))
    daemon.wait_for("schema_newer", timeout=10)
    daemon.wait_for("supervisor_stopping", timeout=5)
    add_task(conn, "after", "echo")
    assert daemon.wait_exit(15) == EXIT_SCHEMA
    # The running task was let finish; nothing was claimed once the schema was seen.
    assert task_row(conn, "running")["status"] == "COMPLETED"
    assert task_row(conn, "after")["status"] == "PENDING"
    failed = daemon.find("supervisor_failed")
    assert failed and f"{newer:04d}_slots_for_everyone" in failed[-1]["error"]

    again = start_daemon("again", wait_ready=False)
    assert again.wait_exit(30) == EXIT_SCHEMA
    assert not again.find("worker_spawned")
    assert task_row(conn, "after")["status"] == "PENDING"
