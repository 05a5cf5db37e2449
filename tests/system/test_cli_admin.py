"""The admin commands as an operator runs them: migrate, check-config, help, schedules,
global limits, the daemon registry and the embedded database; a real subprocess and a real
PostgreSQL."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest

from supervisor import Client, __version__
from supervisor.db import store
from cli_runs import (COMMANDS, assert_refused, pgtaskd, shared_conn,  # noqa: F401
                      shared_dsn, write_config)


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
    version = pgtaskd("--version", dsn=None)
    assert (version.returncode, version.stdout) == (0, f"pgtaskd {__version__}\n")


def test_help_says_which_commands_take_json_and_config_which_dsn_wins_and_the_signals():
    """The top help's promises, checked against the parser and the code that keeps them."""
    from supervisor.cli import build_parser
    from supervisor.daemon.arbiter import SIGNAL_NAMES
    subcommands = next(action for action in build_parser()._actions
                       if isinstance(action, argparse._SubParsersAction)).choices
    lacking = {option: {name for name, parser in subcommands.items()
                        if option not in parser._option_string_actions}
               for option in ("--json", "--config")}
    top = " ".join(pgtaskd("--help", dsn=None).stdout.split())
    promised = re.search(r"Every command(?: but (.+?))? takes -c FILE .*?; all but (.+?) take "
                         r"--json", top)
    assert promised, top
    named = [set(re.split(r", | and ", names)) if names else set()
             for names in promised.groups()]
    assert named == [lacking["--config"], lacking["--json"]]
    # supervisor/config/loader.py: the environment's DSN wins over the config's.
    assert "The database is $PGTASKD_DSN if set, else database.dsn from the config" in top
    run_help = pgtaskd("run", "--help", dsn=None).stdout
    for name in SIGNAL_NAMES.values():
        assert f"SIG{name.upper()}" in run_help


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


def test_schedules_says_which_wait_for_the_database_clock(tmp_path, db_dsn):
    """State rows written by plain SQL: one enqueued through 40 minutes from now (hourly,
    so it waits for the clock), one through the year 9999 (the next pass starts it again),
    one through a time no datetime holds."""
    config = write_config(tmp_path, db_dsn, schedules={
        name: {"cron": "0 * * * *", "task_type": "echo"} for name in ("far", "soon", "weird")})
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pgtaskd_schedule_state (name, cron, timezone, through) "
                     "VALUES ('soon', '0 * * * *', 'UTC', now() + interval '40 minutes'), "
                     "('far', '0 * * * *', 'UTC', '9999-12-31T00:00:00Z'), "
                     "('weird', '0 * * * *', 'UTC', '294276-01-01T00:00:00Z')")
        soon = conn.execute("SELECT through FROM pgtaskd_schedule_state "
                            "WHERE name = 'soon'").fetchone()[0]
    result = pgtaskd("schedules", "-c", config, dsn=None)
    assert result.returncode == 0, result.stderr
    clock = [line for line in result.stdout.splitlines() if line.startswith("clock:")]
    assert len(clock) == 2
    assert clock[0].startswith("clock: schedule far: enqueued through 9999-12-31T00:00:00Z, "
                               "ahead of the database clock (")
    assert "starts it again at the clock" in clock[0]
    assert clock[1].startswith(f"clock: schedule soon: enqueued through "
                               f"{soon.astimezone(timezone.utc):%Y-%m-%dT%H:%M:%S}Z")
    assert "enqueues nothing until the clock passes that instant" in clock[1]

    listed = {s["name"]: s for s in json.loads(
        pgtaskd("schedules", "-c", config, "--json", dsn=None).stdout)}
    assert [listed[n]["clock"] for n in ("far", "soon", "weird")] == ["reanchors", "waits", None]
    # Waiting, soon's next run is the first instant after the one it was enqueued through.
    next_run = datetime.fromisoformat(listed["soon"]["next_run"])
    assert next_run > soon and next_run.minute == 0 and next_run - soon <= timedelta(hours=1)


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


# --- the daemon registry -----------------------------------------------------------------------

LIVE_ID, LOST_ID, STOPPED_ID = (f"6f1c2d7e-0000-4000-8000-00000000000{n}" for n in (1, 2, 3))


def registered(conn, daemon_id: str, daemon: str, pid: int, pools: dict) -> None:
    store.heartbeat_daemon(conn, daemon_id=daemon_id, daemon=daemon,
                           host=daemon.partition(":")[0], pid=pid, version="0.1.0",
                           config_path=daemon.partition(":")[2], interval=5.0, generation=2,
                           state="running", pools=pools)


def test_daemons_prints_each_daemon_with_its_children_and_the_gone_ones_last(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        registered(conn, LOST_ID, "web-1:/etc/pgtaskd.yaml", 99, {})
        conn.execute("UPDATE pgtaskd_daemons SET heartbeat_at = now() - interval '2 hours'")
        registered(conn, STOPPED_ID, "web-3:/etc/pgtaskd.yaml", 77, {})
        store.sign_off_daemon(conn, STOPPED_ID)
        registered(conn, LIVE_ID, "web-2:/etc/pgtaskd.yaml", 4242, {"default": [
            {"slot": 1, "pid": 4243, "generation": 2, "state": "working", "stopping": None,
             "held": 2, "tasks": [{"id": "t-1", "type": "echo", "state": "running"},
                                  {"id": "t-2", "type": "echo", "state": "claimed"}]},
            {"slot": 2, "pid": 4244, "generation": 2, "state": "idle", "stopping": None,
             "held": 0, "tasks": []}]})
    result = pgtaskd("daemons", dsn=db_dsn)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "web-2:/etc/pgtaskd.yaml  pid 4242  running  generation 2  pgtaskd 0.1.0"
    assert re.fullmatch(r"  started \S+Z, last heartbeat \d+\.\d s ago \(every 5 s\), "
                        rf"id {LIVE_ID}", lines[1]), lines[1]
    assert [line.split() for line in lines[2:5]] == [
        ["POOL", "SLOT", "PID", "GEN", "STATE", "TASKS"],
        ["default", "1", "4243", "2", "working", "echo", "t-1,", "+1", "held"],
        ["default", "2", "4244", "2", "idle", "-"]]
    assert lines[5:7] == ["", "web-1:/etc/pgtaskd.yaml  pid 99  LOST (silent 2 h, last said "
                              "running)  generation 2  pgtaskd 0.1.0"]
    assert lines[8:10] == ["", "web-3:/etc/pgtaskd.yaml  pid 77  stopped  generation 2  "
                               "pgtaskd 0.1.0"]
    assert re.fullmatch(r"  started \S+Z, signed off \d+\.\d s ago \(every 5 s\), "
                        rf"id {STOPPED_ID}", lines[10]), lines[10]
    assert len(lines) == 11  # neither had children to list
    lost = pgtaskd("daemons", "--state", "Lost", "--json", dsn=db_dsn)
    assert [d["id"] for d in json.loads(lost.stdout)] == [LOST_ID]
    assert pgtaskd("daemons", "--state", "reloading", dsn=db_dsn).stdout == \
        "(no reloading daemons)\n"
    assert [d["id"] for d in json.loads(pgtaskd("daemons", "--limit", "1", "--json",
                                                dsn=db_dsn).stdout)] == [LIVE_ID]


@pytest.mark.parametrize("arguments, fragment", [
    (["--state", "asleep"], "--state: unknown daemon state 'asleep' (one of: starting, "
                            "running, reloading, stopping, stopped, lost)"),
    (["--limit", "0"], "--limit: must be 1 or more, got 0"),
    (["--limit", "many"], "argument --limit: invalid int value: 'many'"),
    (["--host", "x"], "unrecognized arguments: --host x"),
])
def test_daemons_refuses_bad_arguments_in_one_line(shared_dsn, arguments, fragment):
    assert_refused(pgtaskd("daemons", *arguments, dsn=shared_dsn), 2, fragment)
