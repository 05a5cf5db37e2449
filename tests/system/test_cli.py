"""The operator commands as an operator runs them: the real console script in a subprocess,
a real PostgreSQL, and assertions on exit codes, stdout, stderr and the rows left behind.
Submitting and the task commands here; the admin commands in test_cli_admin.py, refused
input in test_cli_bad_input.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from conftest import TEST_HANDLERS, wait_until
from supervisor import Client
from cli_runs import (COLUMNS, assert_refused, pgtaskd, row, shared_conn,  # noqa: F401
                      shared_dsn, task_count, write_config)


# --- submit ----------------------------------------------------------------------------------


def test_submit_prints_the_new_id_and_stores_a_pending_task(db_dsn, conn):
    result = pgtaskd("submit", "echo", "--payload", '{"text": "hi", "n": 1}', dsn=db_dsn)
    assert (result.returncode, result.stderr) == (0, "")
    task_id = result.stdout.strip()
    assert result.stdout == task_id + "\n" and uuid.UUID(task_id)
    stored = row(conn, task_id)
    assert (stored["status"], stored["task_type"], stored["payload"]) == \
        ("PENDING", "echo", {"text": "hi", "n": 1})


def test_submit_json_with_every_option(db_dsn, conn):
    result = pgtaskd("submit", "report", "--payload", "{}", "--priority", "-3",
                     "--at", "2031-02-03T04:05:06+01:00", "--id", "report-feb", "--name",
                     "February report", "--max-retries", "0", "--json", dsn=db_dsn)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"id": "report-feb", "created": True, "status": "PENDING"}
    stored = row(conn, "report-feb")
    assert (stored["priority"], stored["name"], stored["max_retries"]) == \
        (-3, "February report", 0)
    assert stored["scheduled_time"] == datetime(2031, 2, 3, 3, 5, 6, tzinfo=timezone.utc)


@pytest.mark.parametrize("duration, seconds", [("45", 45), ("30s", 30), ("5m", 300),
                                               ("2h", 7200), ("1d", 86400), ("1.5h", 5400)])
def test_submit_in_delays_from_the_database_clock(db_dsn, conn, duration, seconds):
    result = pgtaskd("submit", "echo", "--in", duration, "--id", "later", dsn=db_dsn)
    assert result.returncode == 0, result.stderr
    stored = row(conn, "later")
    assert stored["scheduled_time"] - stored["created_at"] == timedelta(seconds=seconds)


def test_submit_reads_the_payload_from_a_file_or_stdin(db_dsn, conn, tmp_path):
    payload_file = tmp_path / "payload.json"
    payload_file.write_text('{\n  "rows": [1, 2, 3],\n  "name": "caf\u00e9"\n}\n', "utf-8")
    assert pgtaskd("submit", "echo", "--payload-file", str(payload_file), "--id", "from-file",
                   dsn=db_dsn).returncode == 0
    assert pgtaskd("submit", "echo", "--payload-file", "-", "--id", "from-stdin",
                   stdin='{"via": "stdin"}', dsn=db_dsn).returncode == 0
    assert row(conn, "from-file")["payload"] == {"rows": [1, 2, 3], "name": "caf\u00e9"}
    assert row(conn, "from-stdin")["payload"] == {"via": "stdin"}


def test_submitting_an_existing_id_prints_it_notes_it_and_writes_nothing(db_dsn, conn):
    assert pgtaskd("submit", "echo", "--id", "order-42", dsn=db_dsn).returncode == 0
    Client(db_dsn).cancel("order-42")
    again = pgtaskd("submit", "echo", "--id", "order-42", "--payload", '{"v": 2}', dsn=db_dsn)
    assert (again.returncode, again.stdout) == (0, "order-42\n")
    assert again.stderr == "note: task order-42 exists already (CANCELLED); nothing submitted\n"
    as_json = pgtaskd("submit", "echo", "--id", "order-42", "--json", dsn=db_dsn)
    assert json.loads(as_json.stdout) == {"id": "order-42", "created": False,
                                          "status": "CANCELLED"}
    assert task_count(conn) == 1 and row(conn, "order-42")["payload"] == {}


def test_a_held_unique_key_prints_the_holder_notes_it_and_writes_nothing(db_dsn, conn):
    first = pgtaskd("submit", "echo", "--unique-key", "nightly-export", "--id", "export-1",
                    dsn=db_dsn)
    assert (first.returncode, first.stdout, first.stderr) == (0, "export-1\n", "")
    again = pgtaskd("submit", "echo", "--unique-key", "nightly-export", "--payload", '{"v": 2}',
                    dsn=db_dsn)
    assert (again.returncode, again.stdout) == (0, "export-1\n")
    assert again.stderr == ("note: task export-1 holds unique key 'nightly-export' (PENDING); "
                            "nothing submitted\n")
    as_json = pgtaskd("submit", "echo", "--unique-key", "nightly-export", "--json", dsn=db_dsn)
    assert json.loads(as_json.stdout) == {"id": "export-1", "created": False,
                                          "status": "PENDING"}
    assert task_count(conn) == 1 and row(conn, "export-1")["payload"] == {}
    shown = json.loads(pgtaskd("show", "export-1", "--json", dsn=db_dsn).stdout)
    assert shown["unique_key"] == "nightly-export"
    listed = json.loads(pgtaskd("list", "--json", dsn=db_dsn).stdout)
    assert [t["unique_key"] for t in listed] == ["nightly-export"]
    text = pgtaskd("show", "export-1", dsn=db_dsn).stdout
    assert "unique_key      nightly-export" in text


def test_retrying_a_task_whose_unique_key_is_held_fails_naming_the_holder(db_dsn, conn):
    assert pgtaskd("submit", "echo", "--unique-key", "k", "--id", "old", dsn=db_dsn).returncode == 0
    Client(db_dsn).cancel("old")
    assert pgtaskd("submit", "echo", "--unique-key", "k", "--id", "new", dsn=db_dsn).returncode == 0
    assert_refused(pgtaskd("retry", "old", dsn=db_dsn), 1,
                   "error: cannot retry task 'old': its unique_key 'k' is held by task 'new' "
                   "(PENDING); retry it once that task has finished")
    assert row(conn, "old")["status"] == "CANCELLED"


def test_submit_of_a_type_no_handler_in_the_config_runs_warns_but_submits(db_dsn, conn,
                                                                          tmp_path):
    config = write_config(tmp_path, db_dsn)
    handled = pgtaskd("submit", "echo", "-c", config, "--id", "known", dsn=None)
    assert (handled.returncode, handled.stderr) == (0, "")
    unknown = pgtaskd("submit", "mystery", "-c", config, "--id", "unknown", dsn=None)
    assert (unknown.returncode, unknown.stdout) == (0, "unknown\n")
    assert unknown.stderr.startswith("warning: no handler for task type 'mystery' in ")
    assert len(unknown.stderr.splitlines()) == 1
    assert row(conn, "unknown")["status"] == "PENDING"


def test_payload_limit_comes_from_the_config(db_dsn, conn, tmp_path):
    config = write_config(tmp_path, db_dsn, max_payload_bytes=64)
    small = pgtaskd("submit", "echo", "-c", config, "--payload", json.dumps({"x": "y" * 40}),
                    dsn=None)
    assert small.returncode == 0
    big = pgtaskd("submit", "echo", "-c", config, "--payload", json.dumps({"x": "y" * 80}),
                  dsn=None)
    assert_refused(big, 2, "more than the maximum payload of 64 bytes", "max_payload_bytes")
    assert task_count(conn) == 1


def blocked_on_a_lock(conn) -> bool:
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock'").fetchone()[0] > 0


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_submit_racing_an_uncommitted_submit_of_the_same_id_makes_one_task(db_dsn, conn,
                                                                             first_commits):
    with psycopg.connect(db_dsn) as application:
        Client(application).submit("echo", {"by": "application"}, task_id="raced")
        racer = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "submit", "echo", "--id", "raced",
             "--payload", '{"by": "cli"}', "--json"],
            env={**os.environ, "PGTASKD_DSN": db_dsn}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: blocked_on_a_lock(conn), timeout=20,
                       message="the second insert to wait for the first transaction")
            application.commit() if first_commits else application.rollback()
            out, err = racer.communicate(timeout=30)
        finally:
            if racer.poll() is None:
                racer.kill()
    assert racer.returncode == 0, err
    assert json.loads(out)["created"] is (not first_commits)
    assert task_count(conn) == 1
    assert row(conn, "raced")["payload"] == {"by": "application" if first_commits else "cli"}


# --- cancel, retry, show, list, stats ---------------------------------------------------------


def submit(dsn: str, task_id: str, task_type: str = "echo") -> None:
    with Client(dsn) as client:
        client.submit(task_type, task_id=task_id)


def test_cancel_prints_each_cancelled_id(db_dsn, conn):
    for task_id in ("a", "b"):
        submit(db_dsn, task_id)
    result = pgtaskd("cancel", "a", "b", "a", dsn=db_dsn)
    assert (result.returncode, result.stdout, result.stderr) == (0, "cancelled a\ncancelled b\n", "")
    assert {row(conn, t)["status"] for t in ("a", "b")} == {"CANCELLED"}


def test_cancel_json(db_dsn):
    submit(db_dsn, "a")
    result = pgtaskd("cancel", "a", "--json", dsn=db_dsn)
    assert json.loads(result.stdout) == [{"id": "a", "status": "CANCELLED"}]


def test_cancel_is_all_or_nothing(db_dsn, conn):
    submit(db_dsn, "pending")
    submit(db_dsn, "done")
    Client(db_dsn).cancel("done")
    result = pgtaskd("cancel", "pending", "done", dsn=db_dsn)
    assert_refused(result, 1, "cannot cancel task 'done': it is CANCELLED",
                   "none of the 2 tasks was cancelled")
    assert row(conn, "pending")["status"] == "PENDING"


def test_cancelling_a_finished_or_missing_task_fails_naming_why(shared_dsn, shared_conn):
    assert_refused(pgtaskd("cancel", "finished-task", dsn=shared_dsn), 1,
                   "cannot cancel task 'finished-task': it is CANCELLED",
                   "only PENDING or RUNNING")
    assert_refused(pgtaskd("cancel", "no-such-task", dsn=shared_dsn), 1,
                   "no task with id 'no-such-task'")
    assert row(shared_conn, "finished-task")["status"] == "CANCELLED"


def test_retry_puts_failed_tasks_back_and_refuses_others(db_dsn, conn):
    submit(db_dsn, "failed")
    submit(db_dsn, "pending")
    conn.execute("UPDATE tasks SET status = 'FAILED', retry_count = 3, error_message = 'boom', "
                 "finished_at = now() WHERE id = 'failed'")
    result = pgtaskd("retry", "failed", "--json", dsn=db_dsn)
    assert json.loads(result.stdout) == [{"id": "failed", "status": "PENDING"}]
    stored = row(conn, "failed")
    assert (stored["status"], stored["retry_count"], stored["error_message"],
            stored["finished_at"]) == ("PENDING", 0, None, None)
    assert_refused(pgtaskd("retry", "pending", dsn=db_dsn), 1,
                   "cannot retry task 'pending': it is PENDING")


def test_show_prints_every_column(db_dsn):
    with Client(db_dsn) as client:
        client.submit("echo", {"to": "ops", "items": [1, 2]}, task_id="t1", name="mail ops")
    text = pgtaskd("show", "t1", dsn=db_dsn)
    assert text.returncode == 0
    labels = [line.split()[0] for line in text.stdout.splitlines() if not line.startswith(" ")]
    assert sorted(labels) == sorted(COLUMNS)
    assert "mail ops" in text.stdout and '"to": "ops"' in text.stdout
    as_json = json.loads(pgtaskd("show", "t1", "--json", dsn=db_dsn).stdout)
    assert list(as_json) == COLUMNS + ["last_failure"]
    assert as_json["payload"] == {"to": "ops", "items": [1, 2]}
    for column in ("scheduled_time", "created_at", "updated_at"):
        assert datetime.fromisoformat(as_json[column]).utcoffset() == timedelta(0)
    assert as_json["finished_at"] is None
    assert as_json["last_failure"] is None


def test_worker_prints_tracebacks_and_show_prints_the_last_or_every_failed_attempt(
        db_dsn, conn, tmp_path):
    config = write_config(tmp_path, db_dsn, handlers={
        "path": str(TEST_HANDLERS), "types": {"fail": "basic:fail"}},
        retry={"base_delay": 0, "max_delay": 0, "jitter": 0}, poll_interval=0.05)
    with Client(db_dsn) as client:
        client.submit("fail", {"message": "no route to host"}, task_id="t1", max_retries=1)
    worker = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "worker", "-c", config],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: row(conn, "t1")["status"] == "FAILED", timeout=30,
                   message="both runs to fail")
    finally:
        worker.terminate()
        _, stderr = worker.communicate(timeout=30)
    # Before each failure's log line, its traceback as Python prints it.
    for run in (1, 2):
        printed = stderr.split(f"task t1 (run {run}) failed:\n", 1)[1].splitlines()
        assert printed[0] == "Traceback (most recent call last):", stderr
        assert printed[1].startswith('  File "') and printed[1].endswith(", in fail"), printed
        assert "RuntimeError: no route to host" in printed[2:6], printed

    text = pgtaskd("show", "t1", dsn=db_dsn).stdout.splitlines()
    last = text[text.index("last failed attempt (all of them: --attempts)"):]
    assert last[2].startswith("run 2: exception at ") and ", worker " in last[2], last
    assert last[3] == "  Traceback (most recent call last):"
    assert last[-1] == "  RuntimeError: no route to host"

    every = pgtaskd("show", "t1", "--attempts", dsn=db_dsn).stdout
    history = every[every.index("failed attempts: 2"):].splitlines()
    assert [line.split(":")[0] for line in history if line.startswith("run ")] == [
        "run 1", "run 2"]
    assert history.count("  RuntimeError: no route to host") == 2

    shown = json.loads(pgtaskd("show", "t1", "--attempts", "--json", dsn=db_dsn).stdout)
    assert [a["attempt"] for a in shown["failed_attempts"]] == [1, 2]
    assert shown["last_failure"] == shown["failed_attempts"][-1]
    assert shown["last_failure"]["outcome"] == "exception"
    assert shown["last_failure"]["traceback"].endswith("RuntimeError: no route to host\n")


def test_show_of_a_missing_task_fails(shared_dsn):
    assert_refused(pgtaskd("show", "ghost", dsn=shared_dsn), 1, "no task with id 'ghost'")


def test_list_prints_an_aligned_table_newest_update_first(db_dsn, conn):
    for task_id, task_type in [("a-task", "echo"), ("b", "a-much-longer-type"), ("c", "echo")]:
        submit(db_dsn, task_id, task_type)
    conn.execute("UPDATE tasks SET updated_at = now() + ascii(id) * interval '1 second', "
                 "priority = ascii(id) - 90")
    conn.execute("UPDATE tasks SET status = 'FAILED' WHERE id = 'b'")
    lines = pgtaskd("list", dsn=db_dsn).stdout.splitlines()
    header = lines[0]
    assert header.split() == ["ID", "TYPE", "STATUS", "PRIORITY", "RETRIES", "SCHEDULED",
                              "UPDATED"]
    assert [line.split()[0] for line in lines[1:]] == ["c", "b", "a-task"]
    for line, (status, task_type) in zip(lines[1:], [("PENDING", "echo"),
                                                     ("FAILED", "a-much-longer-type"),
                                                     ("PENDING", "echo")]):
        assert line[header.index("TYPE"):].startswith(task_type)
        assert line[header.index("STATUS"):].startswith(status)
        scheduled = line[header.index("SCHEDULED"):].split()[0]
        assert datetime.strptime(scheduled, "%Y-%m-%dT%H:%M:%SZ")
    priority_end = header.index("PRIORITY") + len("PRIORITY")
    assert all(line[priority_end - 1] != " " for line in lines[1:]), "numbers align right"


def test_list_filters_and_json(db_dsn, conn):
    for task_id, task_type in [("a", "echo"), ("b", "report"), ("c", "echo")]:
        submit(db_dsn, task_id, task_type)
    conn.execute("UPDATE tasks SET status = 'FAILED' WHERE id = 'c'")
    conn.execute("UPDATE tasks SET updated_at = now() + ascii(id) * interval '1 second'")
    listed = json.loads(pgtaskd("list", "--status", "pending", "--json", dsn=db_dsn).stdout)
    assert [t["id"] for t in listed] == ["b", "a"] and list(listed[0]) == COLUMNS
    by_type = json.loads(pgtaskd("list", "--type", "echo", "--limit", "1", "--json",
                                 dsn=db_dsn).stdout)
    assert [t["id"] for t in by_type] == ["c"]
    assert pgtaskd("list", "--type", "nothing", dsn=db_dsn).stdout == "(no tasks)\n"
    assert json.loads(pgtaskd("list", "--type", "nothing", "--json", dsn=db_dsn).stdout) == []


def test_stats_text_and_json(db_dsn, conn):
    for task_id, task_type in [("a", "echo"), ("b", "echo"), ("c", "report")]:
        submit(db_dsn, task_id, task_type)
    conn.execute("UPDATE tasks SET status = 'FAILED' WHERE id = 'b'")
    conn.execute("UPDATE tasks SET scheduled_time = now() - interval '90 seconds' WHERE id = 'a'")
    text = pgtaskd("stats", dsn=db_dsn).stdout
    assert "tasks: 3 (PENDING 2, RUNNING 0, COMPLETED 0, FAILED 1, CANCELLED 0)" in text
    assert "expired leases: 0" in text
    type_lines = {line.split()[0]: line.split()[1:] for line in text.splitlines()[4:]}
    assert type_lines["TYPE"] == ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED",
                                  "TOTAL"]
    assert type_lines["echo"] == ["1", "0", "0", "1", "0", "2"]
    stats = json.loads(pgtaskd("stats", "--json", dsn=db_dsn).stdout)
    assert set(stats) == {"total", "by_status", "by_type", "due_pending", "oldest_pending_age",
                          "expired_leases", "paused_due_pending", "paused_types", "limits",
                          "not_exact"}
    assert stats["not_exact"] == {}, "a small table is counted exactly"
    assert "about" not in text and "more than" not in text
    assert stats["total"] == 3 and stats["by_status"]["FAILED"] == 1
    assert stats["by_type"]["report"]["PENDING"] == 1
    assert stats["due_pending"] == 2 and 90 <= stats["oldest_pending_age"] < 120


def test_stats_text_and_json_say_which_figures_are_estimates(db_dsn, conn, monkeypatch,
                                                             capsys):
    """14.8: on a large table stats estimates; both outputs say which figures. In process,
    with the bars lowered, so that a few thousand rows make a large table."""
    from supervisor.cli import main
    from supervisor.db import queue_figures

    monkeypatch.setattr(queue_figures, "EXACT_COUNT_BELOW", 1_000)
    monkeypatch.setattr(queue_figures, "COUNT_CAP", 100)
    monkeypatch.setenv("PGTASKD_DSN", db_dsn)
    monkeypatch.delenv("PGTASKD_CONFIG", raising=False)
    conn.execute("INSERT INTO tasks (id, name, task_type, status, finished_at) "
                 "SELECT 'done' || g, 'n', 'echo', 'COMPLETED', now() "
                 "FROM generate_series(1, 3000) g")
    conn.execute("INSERT INTO tasks (id, name, task_type) "
                 "SELECT 'due' || g, 'n', 'report' FROM generate_series(1, 500) g")
    conn.execute("ANALYZE tasks")
    assert main(["stats"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].startswith("tasks: about 3")
    assert "PENDING about " in text[0] and "RUNNING 0," in text[0]
    assert "COMPLETED about " in text[0]
    assert text[1] == "due pending: more than 100, the oldest waiting " + text[1].split()[-2] + " s"
    assert text[2] == "expired leases: 0"
    assert text[4].startswith("by type: estimated from a sample")
    assert text[-1].startswith("about: the statistics' or a sample's estimate")
    assert main(["stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["due_pending"] == 101
    assert stats["not_exact"] == {"total": "estimate", "by_type": "estimate",
                                  "due_pending": "at_least",
                                  **{f"by_status.{s}": "estimate"
                                     for s in ("PENDING", "COMPLETED", "FAILED", "CANCELLED")}}


def test_pause_and_resume_print_each_type_and_stats_shows_the_pauses(db_dsn, conn):
    for task_id, task_type in [("a", "echo"), ("b", "echo"), ("c", "report")]:
        submit(db_dsn, task_id, task_type)
    conn.execute("UPDATE tasks SET scheduled_time = now() - interval '90 seconds' WHERE id = 'a'")
    paused = pgtaskd("pause", "echo", "report", "echo", dsn=db_dsn)
    assert (paused.returncode, paused.stdout, paused.stderr) == \
        (0, "paused echo\npaused report\n", "")
    again = pgtaskd("pause", "echo", "--json", dsn=db_dsn)
    (shown,) = json.loads(again.stdout)
    assert (shown["task_type"], shown["paused"], shown["changed"]) == ("echo", True, False)
    assert shown["paused_by"].count("@") == 1
    assert again.stderr.startswith("note: 'echo' was paused already, since 20")
    assert again.stderr.endswith(f" by {shown['paused_by']}\n")

    text = pgtaskd("stats", dsn=db_dsn).stdout.splitlines()
    assert text[1] == "due pending: 0"
    assert text[3].startswith("paused: echo since 20")
    assert text[3].endswith(f" by {shown['paused_by']} (2 due tasks waiting)")
    assert text[4].endswith(" (1 due task waiting)")
    stats = json.loads(pgtaskd("stats", "--json", dsn=db_dsn).stdout)
    assert (stats["due_pending"], stats["paused_due_pending"]) == (0, 3)
    assert stats["oldest_pending_age"] is None
    assert [(p["task_type"], p["due_pending"]) for p in stats["paused_types"]] == \
        [("echo", 2), ("report", 1)]

    resumed = pgtaskd("resume", "report", "echo", dsn=db_dsn)
    assert (resumed.returncode, resumed.stdout, resumed.stderr) == \
        (0, "resumed report\nresumed echo\n", "")
    twice = pgtaskd("resume", "echo", "--json", dsn=db_dsn)
    assert json.loads(twice.stdout) == [{"task_type": "echo", "paused": False, "changed": False}]
    assert twice.stderr == "note: 'echo' was not paused\n"
    stats = json.loads(pgtaskd("stats", "--json", dsn=db_dsn).stdout)
    assert (stats["due_pending"], stats["paused_types"]) == (3, [])
    assert 90 <= stats["oldest_pending_age"] < 120


def test_pausing_a_type_no_handler_in_the_config_runs_warns_but_pauses(db_dsn, tmp_path):
    config = write_config(tmp_path, db_dsn)
    result = pgtaskd("pause", "echo", "mystery", "-c", config, dsn=None)
    assert (result.returncode, result.stdout) == (0, "paused echo\npaused mystery\n")
    assert result.stderr == f"warning: no handler for task type 'mystery' in {config}\n"
    assert [p["task_type"] for p in Client(db_dsn).paused()] == ["echo", "mystery"]


def test_a_bad_type_pauses_nothing(db_dsn):
    assert_refused(pgtaskd("pause", "echo", "t" * 10_000, dsn=db_dsn), 2,
                   "TYPE: longer than 200 characters")
    assert_refused(pgtaskd("pause", "echo", "", dsn=db_dsn), 2, "TYPE: must not be empty")
    assert_refused(pgtaskd("resume", dsn=db_dsn), 2, "required: TYPE")
    assert Client(db_dsn).paused() == []


