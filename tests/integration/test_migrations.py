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
from supervisor.errors import MigrationError


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
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
        for thread in threads:
            thread.start()
        # They ask for the lock again and again, never waiting inside the server (which
        # would deadlock with a concurrent index build).
        wait_until(lambda: holder.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'migrator-%%' "
            "AND query LIKE '%%pg_try_advisory_lock%%'").fetchone()[0] == 2,
            message="both migrations to wait for the lock")
        assert "a" not in results and "b" not in results
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
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


def test_index_builds_let_writers_through_while_they_wait(empty_db_dsn):
    # A writer's transaction is open on a live table when the upgrade to 0002 starts. A plain
    # CREATE INDEX queues for a lock behind it, and every later INSERT queues behind the
    # build (before: the insert below timed out); a concurrent build lets them through.
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        migrate(conn, through=1)
    errors = []
    with psycopg.connect(empty_db_dsn, autocommit=True) as writer, \
            psycopg.connect(empty_db_dsn, autocommit=True) as other:
        writer.execute("BEGIN")
        writer.execute("INSERT INTO tasks (id, name, task_type) VALUES ('open', 'n', 'echo')")

        def upgrade() -> None:
            try:
                with psycopg.connect(empty_db_dsn, autocommit=True,
                                     application_name="migrator") as conn:
                    migrate(conn)
            except Exception as exc:  # surfaced in the main thread below
                errors.append(exc)

        thread = threading.Thread(target=upgrade)
        thread.start()
        wait_until(lambda: other.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'migrator' "
            "AND wait_event_type = 'Lock'").fetchone()[0] == 1,
            message="the migration to wait for the open transaction")
        other.execute("SET statement_timeout = '3s'")
        other.execute("INSERT INTO tasks (id, name, task_type) VALUES ('during', 'n', 'echo')")
        writer.execute("COMMIT")
        thread.join(60)
    assert not errors, errors
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        assert applied_versions(conn) == [m.version for m in available_migrations()]
        invalid = conn.execute("SELECT count(*) FROM pg_index i JOIN pg_class c "
                               "ON c.oid = i.indrelid WHERE c.relname = 'tasks' "
                               "AND NOT i.indisvalid").fetchone()[0]
        assert invalid == 0
        assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 2


def test_a_migration_cut_short_resumes_and_rebuilds_an_invalid_index(empty_db_dsn):
    # As a crash during 0003's concurrent build leaves it: the column added and recorded as
    # a done step, the unique index INVALID (its build failed on duplicate live keys).
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        migrate(conn, through=2)
        conn.execute("ALTER TABLE tasks ADD COLUMN unique_key TEXT")
        conn.execute("INSERT INTO pgtaskd_migration_progress VALUES (3, 1)")
        conn.execute("INSERT INTO tasks (id, name, task_type, unique_key) "
                     "VALUES ('a', 'n', 'echo', 'k'), ('b', 'n', 'echo', 'k')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY tasks_live_unique_key_idx "
                         "ON tasks (unique_key) WHERE status IN ('PENDING', 'RUNNING') "
                         "AND unique_key IS NOT NULL")
        conn.execute("DELETE FROM tasks WHERE id = 'b'")
        assert [m.version for m in migrate(conn)] == [
            m.version for m in available_migrations() if m.version >= 3]
        assert conn.execute("SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = "
                            "'tasks_live_unique_key_idx'::regclass").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM pgtaskd_migration_progress").fetchone()[0] == 0
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO tasks (id, name, task_type, unique_key) "
                         "VALUES ('c', 'n', 'echo', 'k')")


def test_a_schema_newer_than_this_code_is_refused_unless_it_says_old_daemons_may_run(conn):
    known = max(m.version for m in available_migrations())
    conn.execute("INSERT INTO pgtaskd_schema_migrations (version, name, older_daemons_ok) "
                 "VALUES (%s, 'harmless', true)", (known + 1,))
    assert migrate(conn) == []
    conn.execute("INSERT INTO pgtaskd_schema_migrations (version, name) "
                 "VALUES (%s, 'slots_for_everyone')", (known + 2,))
    with pytest.raises(MigrationError) as raised:
        migrate(conn)
    assert str(raised.value) == (
        f"the database's schema has migration {known + 2:04d}_slots_for_everyone, newer than "
        f"this pgtaskd knows ({known:04d}), and daemons before it must not claim tasks: "
        f"upgrade pgtaskd on this host")


def test_a_migration_number_this_code_skipped_is_as_unknown_as_a_newer_one(conn):
    """0008 was never released: a build that applied its own 0008 has a schema this code does
    not know, though no version in it is above this code's latest."""
    known = {m.version for m in available_migrations()}
    assert 8 not in known, "0008 is retired: never give a migration that number"
    conn.execute("INSERT INTO pgtaskd_schema_migrations (version, name) "
                 "VALUES (8, 'another_branch')")
    with pytest.raises(MigrationError, match="0008_another_branch"):
        migrate(conn)
