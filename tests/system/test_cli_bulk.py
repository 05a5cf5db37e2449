"""retry, cancel and purge by filter from the command line: the real console script, a real
PostgreSQL, the summary it prints (text and --json), and refused arguments."""

from __future__ import annotations

import json

import pytest

from cli_runs import (assert_refused, pgtaskd, shared_conn,  # noqa: F401
                      shared_dsn, task_count)


def add(conn, task_id: str, status: str, task_type: str, *, hours_ago: float = 0.1,
        error: str | None = None, unique_key: str | None = None) -> None:
    conn.execute(
        "INSERT INTO tasks (id, name, task_type, status, claimed_by, error_message, unique_key,"
        "                   created_at, finished_at) "
        "VALUES (%(id)s, %(type)s, %(type)s, %(status)s, "
        "        CASE WHEN %(status)s = 'RUNNING' THEN 'w' END, %(error)s, %(key)s, "
        "        now() - %(ago)s * interval '1 hour', "
        "        CASE WHEN %(status)s NOT IN ('PENDING', 'RUNNING') "
        "             THEN now() - %(ago)s * interval '1 hour' END)",
        {"id": task_id, "type": task_type, "status": status, "error": error, "key": unique_key,
         "ago": hours_ago})


def rows(conn) -> list[tuple]:
    return conn.execute("SELECT id, status, xmin::text, xmax::text FROM tasks "
                        "ORDER BY id").fetchall()


def statuses(conn) -> dict[str, str]:
    return dict(conn.execute("SELECT id, status FROM tasks").fetchall())


def test_retry_by_filter_counts_first_then_retries_and_counts_the_refusals(db_dsn, conn):
    add(conn, "c1", "FAILED", "charge", error="TimeoutError: gateway")
    add(conn, "c2", "FAILED", "charge", error="timeout", unique_key="order-7")
    add(conn, "c3", "FAILED", "charge", error="card declined")
    add(conn, "c4", "FAILED", "charge", hours_ago=3, error="timeout")
    add(conn, "c5", "FAILED", "charge", error="timeout", unique_key="order-8")
    add(conn, "holder", "PENDING", "charge", unique_key="order-7")
    before = rows(conn)
    arguments = ["retry", "--type", "charge", "--status", "FAILED", "--since", "1h", "--error",
                 "timeout"]
    dry = pgtaskd(*arguments, "--dry-run", dsn=db_dsn)
    assert (dry.returncode, dry.stderr) == (0, "")
    assert dry.stdout == "would retry 2 tasks, refuse 1 (a live task holds the unique key)\n"
    assert rows(conn) == before, "a dry run wrote"
    done = pgtaskd(*arguments, "--json", dsn=db_dsn)
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == {
        "action": "retry", "dry_run": False, "matched": 3, "changed": 2, "refused": 1,
        "skipped": 0, "batches": 1, "reached_max": False, "at_least": False}
    assert statuses(conn) == {"c1": "PENDING", "c2": "FAILED", "c3": "FAILED", "c4": "FAILED",
                              "c5": "PENDING", "holder": "PENDING"}
    again = pgtaskd("retry", "--type", "charge", "--error", "TIMEOUT", dsn=db_dsn)
    assert again.stdout == ("retried 1 task, refused 1 (a live task holds the unique key), "
                            "skipped 0 (changed or locked by another session meanwhile)\n")


def test_cancel_by_filter_takes_pending_tasks_only(db_dsn, conn):
    for n in range(5):
        add(conn, f"r{n}", "PENDING", "report", hours_ago=n)
    add(conn, "running", "RUNNING", "report")
    add(conn, "other", "PENDING", "echo")
    result = pgtaskd("cancel", "--type", "report", "--before", "30m", "--batch-size", "2",
                     dsn=db_dsn)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == ("cancelled 4 tasks, skipped 0 (changed or locked by another "
                             "session meanwhile)\n")
    assert statuses(conn) == {"r0": "PENDING", "r1": "CANCELLED", "r2": "CANCELLED",
                              "r3": "CANCELLED", "r4": "CANCELLED", "running": "RUNNING",
                              "other": "PENDING"}


def test_purge_older_than_deletes_old_finished_tasks_of_a_type(db_dsn, conn):
    for n, days in enumerate((1, 8, 9, 10)):
        add(conn, f"done{n}", "COMPLETED", "report", hours_ago=24 * days)
    add(conn, "failed", "FAILED", "report", hours_ago=24 * 9)
    add(conn, "echo", "COMPLETED", "echo", hours_ago=24 * 9)
    arguments = ["purge", "--status", "COMPLETED", "--type", "report", "--older-than", "7d"]
    dry = pgtaskd(*arguments, "--dry-run", "--json", dsn=db_dsn)
    assert json.loads(dry.stdout)["matched"] == 3 and task_count(conn) == 6
    result = pgtaskd(*arguments, "--max", "2", dsn=db_dsn)
    assert result.stdout == ("deleted 2 tasks, skipped 0 (changed or locked by another session "
                             "meanwhile); stopped at --max 2\n")
    assert pgtaskd(*arguments, dsn=db_dsn).stdout.startswith("deleted 1 task,")
    assert set(statuses(conn)) == {"done0", "failed", "echo"}


def test_ids_keep_working_as_before_beside_the_filter(db_dsn, conn):
    add(conn, "f1", "FAILED", "charge")
    result = pgtaskd("retry", "f1", dsn=db_dsn)
    assert (result.returncode, result.stdout) == (0, "retried f1\n")


@pytest.mark.parametrize("arguments, fragment", [
    (["retry"], "pgtaskd retry: give task ids, or a filter (--type, --status"),
    (["cancel"], "pgtaskd cancel: give task ids, or a filter"),
    (["purge"], "pgtaskd purge: give a filter (--type"),
    (["retry", "finished-task", "--type", "echo"], "give task ids or a filter (--type, "
                                                   "--status, ...), not both"),
    (["cancel", "x", "--dry-run"], "--dry-run: applies to a filter, not to task ids"),
    (["retry", "x", "--max", "3"], "--max: applies to a filter"),
    (["retry", "--status", "PENDING"], "--status: retry takes FAILED or CANCELLED tasks, "
                                       "not PENDING"),
    (["cancel", "--status", "RUNNING"], "--status: a bulk cancel takes PENDING tasks only; "
                                        "cancel a RUNNING task by its id"),
    (["purge", "--status", "done"], "--status: unknown status 'done'"),
    (["retry", "--since", "yesterday"], "argument --since: cannot read 'yesterday' as a "
                                        "duration back from now"),
    (["retry", "--before", "2026-01-01T00:00"], "argument --before: cannot read"),
    (["retry", "--since", "99999999999d"], "argument --since: '99999999999d' is more than"),
    (["retry", "--since", "1h", "--before", "2h"], "--since: must be earlier than before"),
    (["purge", "--older-than", "1d", "--before", "2d"], "not allowed with"),
    (["purge", "--older-than", "2026-01-01T00:00Z"], "argument --older-than: cannot read"),
    (["retry", "--type", "echo", "--batch-size", "0"], "argument --batch-size: must be at "
                                                       "least 1"),
    (["retry", "--type", "echo", "--batch-size", "10001"], "--batch-size: must be at most "
                                                           "10000"),
    (["cancel", "--type", "echo", "--max", "0"], "argument --max: must be at least 1"),
    (["retry", "--error", ""], "--error: must not be empty"),
    (["purge", "--type", ""], "--type: a task type must not be empty"),
])
def test_bad_bulk_arguments_are_one_line_exit_2_and_write_nothing(shared_dsn, shared_conn,
                                                                   arguments, fragment):
    before = rows(shared_conn)
    assert_refused(pgtaskd(*arguments, dsn=shared_dsn), 2, fragment)
    assert rows(shared_conn) == before
