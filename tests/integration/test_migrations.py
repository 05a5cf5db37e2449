"""The schema: applied once however often and however concurrently, and strict about states."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import psycopg
import pytest

from conftest import wait_until
from supervisor.db import store
from supervisor.db.migrate import MIGRATION_LOCK_KEY, available_migrations, migrate, \
    pending_migrations


def applied_versions(conn) -> list[int]:
    return [row[0] for row in conn.execute(
        "SELECT version FROM pgtaskd_schema_migrations ORDER BY version")]


def test_migrate_is_idempotent(empty_db_dsn):
    every = [m.version for m in available_migrations()]
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        assert [m.version for m in pending_migrations(conn)] == every
        assert [m.version for m in migrate(conn)] == every
        assert migrate(conn) == []
        assert pending_migrations(conn) == []
        assert applied_versions(conn) == every


def test_two_concurrent_migrations_both_succeed_and_apply_once(empty_db_dsn):
    results, errors = {}, []

    def run(name: str) -> None:
        try:
            with psycopg.connect(empty_db_dsn, autocommit=True,
                                 application_name=f"migrator-{name}") as conn:
                results[name] = [m.version for m in migrate(conn)]
        except Exception as exc:  # surfaced in the main thread below
            errors.append(exc)

    with psycopg.connect(empty_db_dsn, autocommit=True) as holder:
        # Hold the migration lock so that both migrations are sure to be waiting at once.
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        wait_until(lambda: holder.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()[0] == 2, message="both migrations to wait for the lock")
        holder.execute("COMMIT")
        for thread in threads:
            thread.join(30)

    assert not errors, errors
    every = [m.version for m in available_migrations()]
    assert sorted([results["a"], results["b"]]) == [[], every]
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        assert applied_versions(conn) == every


def test_a_row_with_only_the_required_columns_is_a_due_pending_task(conn):
    conn.execute("INSERT INTO tasks (id, name, task_type, payload) "
                 "VALUES ('t1', 'plain insert', 'echo', '{\"to\": \"x\"}')")
    row = store.get_task(conn, "t1")
    assert (row["status"], row["priority"], row["retry_count"], row["max_retries"],
            row["attempts"]) == ("PENDING", 0, 0, 3, 0)
    assert row["claimed_by"] is None and row["lease_until"] is None
    assert conn.execute("SELECT scheduled_time <= now() FROM tasks WHERE id = 't1'").fetchone()[0]
    claimed = store.claim_task(conn, worker_id="w", task_types=["echo"], lease_seconds=30)
    assert claimed["id"] == "t1" and claimed["payload"] == {"to": "x"}


def test_the_status_check_rejects_an_unknown_state(conn):
    with pytest.raises(psycopg.errors.CheckViolation, match="tasks_status_check"):
        conn.execute("INSERT INTO tasks (id, name, task_type, payload, status) "
                     "VALUES ('t1', 'n', 'echo', '{}', 'BOGUS')")
    conn.execute("INSERT INTO tasks (id, name, task_type, payload) "
                 "VALUES ('t2', 'n', 'echo', '{}')")
    with pytest.raises(psycopg.errors.CheckViolation, match="tasks_status_check"):
        conn.execute("UPDATE tasks SET status = 'BOGUS' WHERE id = 't2'")


def test_a_running_task_must_name_its_owner(conn):
    with pytest.raises(psycopg.errors.CheckViolation, match="tasks_running_has_owner"):
        conn.execute("INSERT INTO tasks (id, name, task_type, payload, status) "
                     "VALUES ('t1', 'n', 'echo', '{}', 'RUNNING')")


def test_negative_retry_counts_are_rejected(conn):
    with pytest.raises(psycopg.errors.CheckViolation, match="tasks_max_retries_check"):
        conn.execute("INSERT INTO tasks (id, name, task_type, payload, max_retries) "
                     "VALUES ('t1', 'n', 'echo', '{}', -1)")


def test_a_migration_that_the_database_refuses_is_one_line_and_applies_nothing(empty_db_dsn):
    # Someone else's "tasks" table is in the way: no traceback, exit 1, and the whole
    # migration transaction rolled back (no pgtaskd objects left behind).
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE tasks (x int)")
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "migrate"],
                            env={**os.environ, "PGTASKD_DSN": empty_db_dsn},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        'error: migration 0001_tasks failed: relation "tasks" already exists']
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        leftovers = conn.execute(
            "SELECT to_regclass('pgtaskd_schema_migrations'), "
            "to_regclass('pgtaskd_lease_token_seq')").fetchone()
    assert leftovers == (None, None)
