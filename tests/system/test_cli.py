"""The operator commands as an operator runs them: the real console script in a subprocess,
a real PostgreSQL, and assertions on exit codes, stdout, stderr and the rows left behind."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import TEST_HANDLERS, scratch_database, wait_until
from supervisor import Client
from supervisor.cli import parse_duration
from supervisor.client import STATUSES

COMMANDS = ["submit", "cancel", "retry", "show", "list", "stats", "migrate", "check-config",
            "pause", "resume", "schedules"]
COLUMNS = ["id", "name", "task_type", "payload", "priority", "scheduled_time", "status",
           "retry_count", "max_retries", "created_at", "updated_at", "claimed_by", "lease_until",
           "error_message", "lease_token", "attempts", "started_at", "finished_at",
           "unique_key", "cpu_seconds", "peak_rss_bytes", "slot"]


def pgtaskd(*args: str, dsn: str | None, stdin: str | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("PGTASKD_DSN", "PGTASKD_CONFIG")}
    if dsn:
        environment["PGTASKD_DSN"] = dsn
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], input=stdin,
                          capture_output=True, text=True, env=environment, timeout=60)


def assert_refused(result: subprocess.CompletedProcess, code: int, *fragments: str) -> str:
    """One line on stderr, no traceback, nothing on stdout; returns the line."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def task_count(conn) -> int:
    return conn.execute("SELECT count(*) FROM tasks").fetchone()[0]


def row(conn, task_id: str) -> dict:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM tasks WHERE id = %s", (task_id,)).fetchone()


def write_config(tmp_path: Path, dsn: str | None = None, **tree) -> str:
    path = tmp_path / "pgtaskd.yaml"
    path.write_text(yaml.safe_dump({
        **({"database": {"dsn": dsn}} if dsn else {}),
        "handlers": {"path": str(TEST_HANDLERS), "types": {"echo": "basic:echo"}},
        **tree,
    }))
    return str(path)


@pytest.fixture(scope="module")
def shared_dsn(pg_admin_dsn, template_db):
    """One database for the many tests and examples that must leave it unchanged."""
    with scratch_database(pg_admin_dsn, "pgtaskd_cli", template_db) as dsn:
        with Client(dsn) as client:
            client.submit("echo", task_id="finished-task")
            client.cancel("finished-task")
        yield dsn


@pytest.fixture
def shared_conn(shared_dsn):
    with psycopg.connect(shared_dsn, autocommit=True) as conn:
        yield conn


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
    assert list(as_json) == COLUMNS
    assert as_json["payload"] == {"to": "ops", "items": [1, 2]}
    for column in ("scheduled_time", "created_at", "updated_at"):
        assert datetime.fromisoformat(as_json[column]).utcoffset() == timedelta(0)
    assert as_json["finished_at"] is None


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
                          "expired_leases", "paused_due_pending", "paused_types", "limits"}
    assert stats["total"] == 3 and stats["by_status"]["FAILED"] == 1
    assert stats["by_type"]["report"]["PENDING"] == 1
    assert stats["due_pending"] == 2 and 90 <= stats["oldest_pending_age"] < 120


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


# --- migrate, check-config, help, the embedded database ---------------------------------------


def test_migrate_then_up_to_date_text_and_json(empty_db_dsn):
    first = pgtaskd("migrate", "--json", dsn=empty_db_dsn)
    assert json.loads(first.stdout)["applied"][0] == "0001_tasks"
    assert pgtaskd("migrate", dsn=empty_db_dsn).stdout == "schema is up to date\n"
    assert json.loads(pgtaskd("migrate", "--json", dsn=empty_db_dsn).stdout) == {"applied": []}


def test_check_config_json(tmp_path, db_dsn):
    good = json.loads(pgtaskd("check-config", "-c", write_config(tmp_path, db_dsn), "--json",
                              dsn=None).stdout)
    assert good["ok"] is True and good["handlers"] == {"echo": "basic:echo"}
    broken = tmp_path / "broken.yaml"
    broken.write_text("lease: {seconds: -1}\n")
    result = pgtaskd("check-config", "-c", str(broken), "--json", dsn=None)
    assert result.returncode == 2
    assert json.loads(result.stdout)["ok"] is False
    assert "lease.seconds" in result.stderr


def test_help_explains_every_command_with_an_example():
    top = pgtaskd("--help", dsn=None)
    assert top.returncode == 0
    for command in COMMANDS:
        assert f"pgtaskd {command}" in top.stdout
        text = pgtaskd(command, "--help", dsn=None).stdout
        assert "examples:" in text and f"pgtaskd {command}" in text
        for option in ("--config", "--json"):
            assert option in text
    submit_help = pgtaskd("submit", "--help", dsn=None).stdout
    for option in ("--payload", "--payload-file", "--priority", "--at", "--in", "--id",
                   "--name", "--max-retries", "--unique-key"):
        assert option in submit_help
    list_help = pgtaskd("list", "--help", dsn=None).stdout
    for option in ("--status", "--type", "--limit"):
        assert option in list_help


SCHEDULES = {
    "nightly-report": {"cron": "30 2 * * *", "timezone": "America/New_York",
                       "task_type": "echo", "catch_up": "all"},
    "heartbeat": {"cron": "*/10 * * * * *", "task_type": "echo"},
}


def test_schedules_lists_each_schedule_with_its_next_run(tmp_path, shared_dsn, shared_conn):
    config = write_config(tmp_path, schedules=SCHEDULES)
    result = pgtaskd("schedules", "-c", config, dsn=shared_dsn)
    assert result.returncode == 0, result.stderr
    # In the file's order (write_config's YAML sorts the keys).
    header, heartbeat, nightly = result.stdout.splitlines()
    assert header.split() == ["NAME", "CRON", "TIMEZONE", "TYPE", "NEXT", "RUN", "LAST", "RUN",
                              "LAST", "STATUS"]
    assert nightly.split()[:7] == ["nightly-report", "30", "2", "*", "*", "*",
                                   "America/New_York"]
    # Never ran: no last run, no status.
    assert nightly.split()[-2:] == ["-", "-"] and heartbeat.split()[-2:] == ["-", "-"]
    now = shared_conn.execute("SELECT now()").fetchone()[0]

    listed = json.loads(pgtaskd("schedules", "-c", config, "--json", dsn=shared_dsn).stdout)
    assert [s["name"] for s in listed] == ["heartbeat", "nightly-report"]
    beat = listed[0]
    next_run = datetime.fromisoformat(beat["next_run"])
    assert now < next_run <= now + timedelta(seconds=11) and next_run.second % 10 == 0
    assert (beat["cron"], beat["timezone"], beat["catch_up"], beat["last_run"],
            beat["last_status"]) == ("*/10 * * * * *", "UTC", "latest", None, None)
    # 02:30 in New York is 06:30 or 07:30 UTC, or 07:00 on the spring-forward night.
    assert datetime.fromisoformat(listed[1]["next_run"]).strftime("%H:%M") in (
        "06:30", "07:30", "07:00")


def test_schedules_without_any_says_so(tmp_path, shared_dsn):
    result = pgtaskd("schedules", "-c", write_config(tmp_path), dsn=shared_dsn)
    assert result.returncode == 0 and result.stdout.startswith("(no schedules in ")
    assert json.loads(pgtaskd("schedules", "-c", write_config(tmp_path), "--json",
                              dsn=shared_dsn).stdout) == []


def test_a_bad_schedule_is_one_line_per_problem_and_exit_2(tmp_path, shared_dsn):
    config = write_config(tmp_path, schedules={
        "a": {"cron": "61 * * * *", "task_type": "echo"},
        "b": {"cron": "@daily", "task_type": "echo", "timezone": "Europe/Atlantis"}})
    result = pgtaskd("schedules", "-c", config, dsn=shared_dsn)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    first, second = result.stderr.splitlines()
    assert first.endswith("schedules.a.cron: not a cron expression: bad minute field, "
                          "got '61 * * * *'")
    assert "schedules.b.timezone: unknown time zone 'Europe/Atlantis'" in second


def test_check_config_warns_of_a_scheduled_type_without_a_handler(tmp_path):
    config = write_config(tmp_path, schedules={
        "resize": {"cron": "@hourly", "task_type": "resize"}})
    result = pgtaskd("check-config", "-c", config, dsn=None)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ("config warning: schedules.resize.task_type: no handler for "
                             "'resize' under handlers.types; its tasks wait for a daemon whose "
                             "config handles it\n")
    assert result.stdout.startswith("config ok: handlers [echo], pools [default=1], "
                                    "schedules [resize], ")
    report = json.loads(pgtaskd("check-config", "-c", config, "--json", dsn=None).stdout)
    assert report["schedules"] == {"resize": {"cron": "@hourly", "timezone": "UTC",
                                              "task_type": "resize"}}
    assert len(report["warnings"]) == 1


@pytest.fixture
def embedded_dir():
    """A folder outside pytest's tmp_path: pytest resets its base folder to mode 0700 whenever
    a session starts, and under root the embedded server runs as another user that must be
    able to reach its data directory."""
    folder = Path(tempfile.mkdtemp(prefix="pgtaskd-embedded-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_without_a_dsn_the_commands_use_the_embedded_database(embedded_dir):
    config = embedded_dir / "embedded.yaml"
    config.write_text("database:\n  data_dir: pgdata\n")
    migrated = pgtaskd("migrate", "-c", str(config), dsn=None)
    assert migrated.returncode == 0, migrated.stderr
    submitted = pgtaskd("submit", "echo", "-c", str(config), "--id", "local", dsn=None)
    assert submitted.returncode == 0, submitted.stderr
    shown = json.loads(pgtaskd("show", "local", "-c", str(config), "--json", dsn=None).stdout)
    assert shown["status"] == "PENDING"


# --- bad input --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("command", [["submit", "echo"], ["cancel", "x"], ["stats"], ["migrate"]])
def test_an_unreachable_database_is_one_line_with_host_and_port_and_no_password(command):
    port = free_port()
    result = pgtaskd(*command, dsn=f"postgresql://app:s3cret-pw@127.0.0.1:{port}/tasks")
    line = assert_refused(result, 1, f"127.0.0.1:{port}", "cannot connect to PostgreSQL")
    assert "s3cret-pw" not in line


def test_a_database_without_the_schema_says_to_migrate(empty_db_dsn):
    assert_refused(pgtaskd("submit", "echo", dsn=empty_db_dsn), 1, "pgtaskd migrate")


@pytest.mark.parametrize("arguments, fragment", [
    (["submit", "echo", "--payload", "{not json"], "--payload: not valid JSON"),
    (["submit", "echo", "--payload", "[1, 2]"], "must be a JSON object"),
    (["submit", "echo", "--payload", '"text"'], "must be a JSON object"),
    (["submit", "echo", "--payload", '{"x": NaN}'], "NaN is not a JSON number"),
    (["submit", "echo", "--payload", '{"x": "\\u0000"}'], "NUL"),
    (["submit", "echo", "--payload", '{"x": 1e999}'], "cannot be stored as JSON"),
    (["submit", "echo", "--payload", "{}", "--payload-file", "x"], "not allowed with"),
    (["submit", "echo", "--payload-file", "/no/such/file"], "No such file or directory"),
    (["submit", "echo", "--at", "2030-01-01T09:00:00"], "has no time zone"),
    (["submit", "echo", "--at", "next tuesday"], "cannot read 'next tuesday'"),
    (["submit", "echo", "--at", "2030-01-01T09:00Z", "--in", "5m"], "not allowed with"),
    (["submit", "echo", "--in=-5s"], "as a duration"),
    (["submit", "echo", "--in", "3 weeks"], "as a duration"),
    (["submit", "echo", "--max-retries", "-1"], "--max-retries: must be 0 or more"),
    (["submit", "echo", "--priority", "high"], "invalid int value: 'high'"),
    (["submit", "echo", "--priority", "3000000000"], "--priority: must be at most"),
    (["submit", "echo", "--id", "has\ttab"], "control"),
    (["submit", "echo", "--unique-key", "k" * 10_000], "--unique-key: longer than 200 characters"),
    (["submit", "echo", "--unique-key", ""], "--unique-key: must not be empty"),
    (["submit", "echo", "--unique-key", "a\x1b[31m"], "--unique-key: must not contain control"),
    (["submit", "", "--id", "x"], "TYPE: must not be empty"),
    (["submit"], "required: TYPE"),
    (["list", "--status", "done"], "unknown status 'done'"),
    (["list", "--limit", "0"], "limit: must be 1 or more"),
    (["frobnicate"], "invalid choice"),
    (["list", "--colour"], "unrecognized arguments"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(shared_dsn, shared_conn, arguments,
                                                         fragment):
    before = task_count(shared_conn)
    assert_refused(pgtaskd(*arguments, dsn=shared_dsn), 2, fragment)
    assert task_count(shared_conn) == before


def test_a_bad_config_is_exit_2(tmp_path, shared_dsn):
    config = tmp_path / "bad.yaml"
    config.write_text("max_payload_bytes: lots\n")
    result = pgtaskd("submit", "echo", "-c", str(config), dsn=shared_dsn)
    assert_refused(result, 2, "max_payload_bytes")


# --- properties -------------------------------------------------------------------------------

# Command lines are UTF-8 without NUL: other text cannot reach the program at all.
ARG_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False,
                      allow_infinity=False), st.text(max_size=20))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12)
PAYLOAD_TEXT = st.one_of(
    st.dictionaries(st.text(max_size=10), JSON_VALUE, max_size=5).map(json.dumps),
    JSON_VALUE.map(json.dumps),
    ARG_TEXT,
    st.sampled_from(['{"a": NaN}', '{"a": -Infinity}', '{"a": "\\u0000"}', '{"a": 1e400}',
                     "[" * 3000, '{"a": 1}  trailing', '{"a":1,"a":2}', "\ufeff{}"]),
)
# Fixed offsets rather than st.timezones(), which needs a tz database on the machine.
OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
OPTION = st.one_of(
    st.tuples(st.just("--priority"), st.one_of(st.integers(-2**40, 2**40).map(str), ARG_TEXT)),
    st.tuples(st.just("--max-retries"), st.one_of(st.integers(-10, 10).map(str), ARG_TEXT)),
    st.tuples(st.just("--at"), st.one_of(
        st.datetimes(timezones=OFFSETS).map(lambda d: d.isoformat()),
        st.datetimes().map(lambda d: d.isoformat()), ARG_TEXT)),
    st.tuples(st.just("--in"), st.one_of(
        st.tuples(st.integers(0, 10**6), st.sampled_from(["", "s", "m", "h", "d"]))
          .map(lambda p: f"{p[0]}{p[1]}"), ARG_TEXT)),
    st.tuples(st.just("--name"), ARG_TEXT),
)
PROPERTY_SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                    HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(task_type=st.one_of(st.just("echo"), ARG_TEXT), payload=PAYLOAD_TEXT,
       options=st.lists(OPTION, max_size=3, unique_by=lambda o: o[0]))
def test_any_submit_either_writes_one_task_or_one_line_and_nothing(shared_dsn, shared_conn,
                                                                   task_type, payload, options):
    task_id = f"prop-{uuid.uuid4()}"
    argv = ["submit", "--id", task_id, f"--payload={payload}",
            *(f"{name}={value}" for name, value in options), "--json", "--", task_type]
    before = task_count(shared_conn)
    result = pgtaskd(*argv, dsn=shared_dsn)
    assert "Traceback" not in result.stderr
    stored = row(shared_conn, task_id)
    if result.returncode == 0:
        assert json.loads(result.stdout) == {"id": task_id, "created": True, "status": "PENDING"}
        assert stored is not None and stored["task_type"] == task_type
        # jsonb keeps numbers as decimals (1e2 comes back as 100): compare them as numbers.
        stored_text = shared_conn.execute("SELECT payload::text FROM tasks WHERE id = %s",
                                          (task_id,)).fetchone()[0]
        assert as_decimals(stored_text) == as_decimals(payload.lstrip("\ufeff"))
        assert task_count(shared_conn) == before + 1
    else:
        assert result.returncode in (1, 2), result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
        assert stored is None and task_count(shared_conn) == before


def as_decimals(text: str):
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


NOT_AN_OBJECT = st.one_of(JSON_VALUE.filter(lambda v: not isinstance(v, dict)).map(json.dumps),
                          ARG_TEXT.filter(lambda t: not _could_be_an_object(t)))
BAD_SUBMIT = st.one_of(
    NOT_AN_OBJECT.map(lambda p: [f"--payload={p}"]),
    st.dictionaries(st.text(max_size=5), JSON_VALUE, max_size=3).map(
        lambda d: [f"--payload={json.dumps({**d, 'bad': float('nan')})}"]),
    st.datetimes().map(lambda d: [f"--at={d.isoformat()}"]),
    ARG_TEXT.filter(lambda t: not _is_iso(t)).map(lambda t: [f"--at={t}"]),
    ARG_TEXT.filter(lambda t: not _is_duration(t)).map(lambda t: [f"--in={t}"]),
    st.integers(max_value=-1).map(lambda n: [f"--max-retries={n}"]),
)


def _could_be_an_object(text: str) -> bool:
    """Whether the text might parse as a JSON object (a byte-order mark is skipped)."""
    return text.strip().lstrip("\ufeff").strip().startswith("{")


def _is_iso(text: str) -> bool:
    try:
        datetime.fromisoformat(text.strip())
        return True
    except ValueError:
        return False


def _is_duration(text: str) -> bool:
    try:
        parse_duration(text)
        return True
    except argparse.ArgumentTypeError:
        return False


@PROPERTY_SETTINGS
@given(case=st.one_of(
    BAD_SUBMIT.map(lambda bad: (["submit", "--id", "never", *bad, "--", "echo"], 2)),
    ARG_TEXT.filter(lambda s: s.upper() not in STATUSES)
            .map(lambda s: (["list", f"--status={s}"], 2)),
    ARG_TEXT.filter(lambda s: s.strip() and s != "finished-task")
            .map(lambda s: (["cancel", "--", s], 1)),
    st.just((["cancel", "finished-task"], 1)),
    ARG_TEXT.filter(lambda s: s.strip() and s != "finished-task")
            .map(lambda s: (["show", "--", s], 1)),
))
def test_bad_input_of_any_shape_is_refused_without_a_trace(shared_dsn, shared_conn, case):
    argv, code = case
    before = shared_conn.execute("SELECT count(*), max(updated_at) FROM tasks").fetchone()
    result = pgtaskd(*argv, dsn=shared_dsn)
    assert_refused(result, code)
    assert shared_conn.execute("SELECT count(*), max(updated_at) FROM tasks").fetchone() == before
    assert row(shared_conn, "never") is None


def test_limit_sets_changes_lists_and_removes_a_global_limit(db_dsn):
    result = pgtaskd("limit", "charge", "2", dsn=db_dsn)
    assert (result.returncode, result.stdout, result.stderr) == \
        (0, "charge: at most 2 running\n", "")
    result = pgtaskd("limit", "charge", "3", dsn=db_dsn)
    assert (result.stdout, result.stderr) == ("charge: at most 3 running\n",
                                              "note: the limit was 2\n")
    listing = pgtaskd("limits", dsn=db_dsn).stdout.splitlines()
    assert listing[0].split() == ["TYPE", "LIMIT", "RUNNING", "SET", "BY"]
    assert listing[1].split()[:3] == ["charge", "3", "0"]
    (row,) = json.loads(pgtaskd("limits", "--json", dsn=db_dsn).stdout)
    assert (row["task_type"], row["max_running"], row["running"]) == ("charge", 3, 0)
    result = pgtaskd("limit", "charge", "off", dsn=db_dsn)
    assert (result.returncode, result.stdout) == (0, "charge: no limit\n")
    assert pgtaskd("limit", "charge", "off", dsn=db_dsn).stderr == "note: 'charge' had no limit\n"
    assert pgtaskd("limits", dsn=db_dsn).stdout == "(no limits)\n"


@pytest.mark.parametrize("arguments, fragment", [
    (["limit", "charge", "0"], "argument N: must be a whole number from 1 to 10000, or 'off', "
                               "got '0'"),
    (["limit", "charge", "-1"], "argument N: must be a whole number from 1 to 10000"),
    (["limit", "charge", "two"], "argument N: must be a whole number from 1 to 10000"),
    (["limit", "charge", "10001"], "argument N: must be a whole number from 1 to 10000"),
    (["limit", "", "2"], "TYPE: must not be empty"),
    (["limit", "t" * 10_000, "2"], "TYPE: longer than 200 characters"),
])
def test_a_bad_limit_is_refused_in_one_line_and_sets_nothing(db_dsn, arguments, fragment):
    assert_refused(pgtaskd(*arguments, dsn=db_dsn), 2, fragment)
    assert Client(db_dsn).limits() == []
