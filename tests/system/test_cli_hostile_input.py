"""Hostile input to the operator commands: a config built to exhaust memory, passwords that
break naive redaction, bytes and values the parsers refuse. Each ends in one line on stderr
and a non-zero exit, never a traceback, a hang, or a secret on the screen."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import psycopg
import pytest

from conftest import billion_laughs
from secret_dsns import SECRET_STEM, dsn_shapes
from cli_runs import assert_refused, free_port, pgtaskd

# A check-config that stays within this much address space has not expanded the bomb: the
# expanded value would take gigabytes.
MEMORY_LIMIT = 1024 * 1024 * 1024
# A safety bound, not a speed measurement: refusing the file takes well under a second.
DEADLINE = 10.0


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_bounded(*args: str) -> subprocess.CompletedProcess:
    """pgtaskd with its address space capped; past the deadline the run fails the test."""
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args],
                          capture_output=True, text=True, timeout=DEADLINE,
                          preexec_fn=_limit_memory)


# --- a config built to exhaust memory ---------------------------------------------------------


def test_check_config_refuses_a_billion_laughs_at_once_in_little_memory(tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(billion_laughs())
    started = time.monotonic()
    result = run_bounded("check-config", "-c", str(config))
    line = assert_refused(result, 2, str(config), "aliases (*name) are not allowed")
    assert len(line) < 300 and time.monotonic() - started < DEADLINE


def test_check_config_json_on_a_billion_laughs_is_one_problem(tmp_path):
    config = tmp_path / "bomb.yaml"
    config.write_text(billion_laughs())
    result = run_bounded("check-config", "-c", str(config), "--json")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert '"ok": false' in result.stdout and len(result.stdout) < 1000


# --- passwords that break naive redaction -----------------------------------------------------

HOSTILE_PASSWORDS = [f"{SECRET_STEM}0/p@ss:w%rd@{SECRET_STEM}1",
                     f"{SECRET_STEM}0 'q\"uo\\te' %40 \u00e9?&{SECRET_STEM}1"]


@pytest.fixture(scope="module")
def closed_port() -> int:
    return free_port()


@pytest.mark.parametrize("password", HOSTILE_PASSWORDS)
@pytest.mark.parametrize("shape", list(dsn_shapes("x", 1)))
def test_no_command_prints_a_part_of_the_password(closed_port, password, shape):
    dsn = dsn_shapes(password, closed_port)[shape]
    # Whatever host or port libpq reads out of a misread password, it goes nowhere else.
    pinned = {"PGHOSTADDR": "127.0.0.1", "PGPORT": str(closed_port), "PGCONNECT_TIMEOUT": "2"}
    for command in (["check-config"], ["check-config", "--json"], ["stats"]):
        result = pgtaskd(*command, dsn=dsn, env=pinned)
        shown = result.stdout + result.stderr
        assert SECRET_STEM not in shown, (command, dsn, shown)
        assert "Traceback" not in shown and len(result.stderr.splitlines()) <= 1, shown
        if command == ["stats"]:
            # Exit 2 for a DSN libpq cannot read at all, 1 for a server it cannot reach.
            assert (result.returncode, result.stderr.split(":")[0]) in {
                (1, "error"), (2, "config error")}, shown


# --- bytes and values the parsers refuse ------------------------------------------------------

TASK_COMMANDS = [["check-config"], ["stats"], ["list"], ["show", "some-id"]]


@pytest.mark.parametrize("command", TASK_COMMANDS)
def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path, command):
    config = tmp_path / "latin1.yaml"
    config.write_bytes(b"poll_interval: 1\n# caf\xe9\n")
    assert_refused(pgtaskd(*command, "-c", str(config), dsn=None), 2,
                   f"{config}: not UTF-8 text: byte 0xe9 at line 2")


@pytest.mark.parametrize("command", TASK_COMMANDS)
@pytest.mark.parametrize("dsn, fragment", [
    # A byte of a non-UTF-8 environment reaches Python as a lone surrogate.
    (f"host=127.0.0.1 port=1 password={SECRET_STEM}\udcff", "a byte that is not UTF-8"),
    ("host=127.0.0.1 port=1 dbname='unterminated", "unterminated quoted string"),
    (f"host=127.0.0.1 port=1 password={SECRET_STEM}0 {SECRET_STEM}1", "connection string"),
])
def test_a_dsn_libpq_cannot_read_is_one_line_exit_2(command, dsn, fragment):
    line = assert_refused(pgtaskd(*command, dsn=dsn), 2, "PGTASKD_DSN", fragment)
    assert SECRET_STEM not in line


# --- payloads PostgreSQL stores and Python's json cannot read ----------------------------------

HUGE_INTEGER = "9" * 5000  # past Python's 4300-digit limit on reading an integer
DEEP = "[" * 3000 + "]" * 3000  # past Python's recursion limit
# A number past a float's range: Python's json would read it as inf and print "Infinity".
HUGE_DECIMAL = "1" + "0" * 400 + ".5"
STORED = {"huge-int": f'{{"n": {HUGE_INTEGER}}}', "deep": f'{{"deep": {DEEP}}}',
          "huge-decimal": f'{{"x": {HUGE_DECIMAL}}}'}


@pytest.fixture
def stored_tasks(db_dsn, conn):
    for task_id, payload in STORED.items():
        conn.execute("INSERT INTO tasks (id, name, task_type, payload) "
                     "VALUES (%s, %s, 'echo', %s::jsonb)", (task_id, task_id, payload))
    return db_dsn


def payload_text(conn, task_id: str) -> str:
    return conn.execute("SELECT payload::text FROM tasks WHERE id = %s", (task_id,)).fetchone()[0]


@pytest.mark.parametrize("task_id", list(STORED))
def test_show_prints_a_payload_python_cannot_read_as_stored(stored_tasks, conn, task_id):
    result = pgtaskd("show", task_id, dsn=stored_tasks)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert payload_text(conn, task_id) in result.stdout and "Infinity" not in result.stdout
    assert result.stderr.startswith(f"note: task {task_id}: the payload is shown as "
                                    f"PostgreSQL stores it"), result.stderr
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("task_id", list(STORED))
def test_show_json_carries_a_payload_python_cannot_read_verbatim(stored_tasks, conn, task_id):
    result = pgtaskd("show", task_id, "--json", dsn=stored_tasks)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr[-2000:]
    assert result.stdout.isascii() and payload_text(conn, task_id) in result.stdout
    if task_id != "deep":  # Python's json cannot read that one back either
        shown = json.loads(result.stdout, parse_int=str, parse_float=str)
        assert (shown["id"], shown["status"]) == (task_id, "PENDING")


def test_list_shows_tasks_whose_payload_python_cannot_read(stored_tasks, conn):
    table = pgtaskd("list", dsn=stored_tasks)
    assert (table.returncode, table.stderr) == (0, ""), table.stderr[-2000:]
    assert all(task_id in table.stdout for task_id in STORED)
    listed = pgtaskd("list", "--json", dsn=stored_tasks)
    assert (listed.returncode, listed.stderr) == (0, ""), listed.stderr[-2000:]
    for task_id in STORED:
        assert payload_text(conn, task_id) in listed.stdout


# --- hostile arguments ------------------------------------------------------------------------

TEN_KB = "x" * 10_000
MANY_DIGITS = "9" * 5_000  # past Python's 4300-digit limit on reading an integer


@pytest.mark.parametrize("arguments, code, fragment", [
    (["submit", "echo", "--payload", '{"a": "' + "y" * 120_000 + '"}', "--id", "big"], 0, ""),
    (["submit", "echo", "--payload", '{"a": ' + MANY_DIGITS + "}"], 2, "--payload: not valid"),
    (["submit", "echo", "--payload", "[" * 100_000], 2, "nested too deeply"),
    (["submit", "echo", "--id", TEN_KB], 2, "--id: longer than 200 characters"),
    (["submit", TEN_KB], 2, "TYPE: longer than 200 characters"),
    (["submit", "echo", "--priority", "1e30"], 2, "--priority: invalid int value: '1e30'"),
    (["submit", "echo", "--priority", MANY_DIGITS], 2, "--priority: invalid int value"),
    (["submit", "echo", "--max-retries", MANY_DIGITS], 2, "--max-retries: invalid int value"),
    (["submit", "echo", "--in", "-5"], 2, "cannot read '-5' as a duration"),
    (["submit", "echo", "--in", MANY_DIGITS + "d"], 2, "--in: must be from 0 to"),
    (["submit", "echo", "--in", TEN_KB], 2, "as a duration"),
    (["submit", "echo", "--at", "2026-02-30T09:00:00Z"], 2, "as an ISO-8601 timestamp"),
    (["submit", "echo", "--at", "0001-01-01T00:00:00+01:00"], 2, "is out of range"),
    (["submit", "echo", "--at", TEN_KB], 2, "as an ISO-8601 timestamp"),
    (["show", TEN_KB], 1, "no task with id 'xxxx"),
    (["cancel", TEN_KB], 1, "no task with id 'xxxx"),
    (["retry", TEN_KB], 1, "no task with id 'xxxx"),
    (["list", "--limit", MANY_DIGITS], 2, "--limit: invalid int value"),
    (["list", "--status", TEN_KB], 2, "unknown status 'xxxx"),
    (["list", "--type", TEN_KB], 0, ""),
    (["worker", "--pool", TEN_KB], 2, "--pool: no pool named 'xxxx"),
    (["bench", "--runs", MANY_DIGITS], 2, "--runs: "),
    ([TEN_KB], 2, "invalid choice: 'xxxx"),
    (["stats", TEN_KB], 2, "unrecognized arguments: xxxx"),
])
def test_hostile_arguments_end_in_one_short_line(db_dsn, arguments, code, fragment):
    result = pgtaskd(*arguments, dsn=db_dsn)
    if code == 0:
        assert (result.returncode, result.stderr) == (0, ""), result.stderr[:1000]
        return
    line = assert_refused(result, code, fragment)
    assert len(line) < 400, line[:1000]


# --- timestamps PostgreSQL stores and Python's datetime cannot hold -----------------------------

FAR_TIMES = {"never": "infinity", "long-ago": "-infinity", "year-20000": "20000-01-01 00:00Z",
             "before-christ": "0100-01-01 00:00Z BC"}


@pytest.fixture
def far_tasks(db_dsn, conn):
    for task_id, moment in FAR_TIMES.items():
        conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                     "VALUES (%s, %s, 'echo', %s)", (task_id, task_id, moment))
    conn.execute("INSERT INTO tasks (id, name, task_type) VALUES ('plain', 'plain', 'echo')")
    return db_dsn


@pytest.mark.parametrize("task_id", list(FAR_TIMES))
def test_show_prints_a_time_python_cannot_hold_as_postgresql_writes_it(far_tasks, task_id):
    text = pgtaskd("show", task_id, dsn=far_tasks)
    assert (text.returncode, text.stderr) == (0, ""), text.stderr
    scheduled = [line for line in text.stdout.splitlines() if line.startswith("scheduled_time")]
    assert scheduled[0].split()[1] in FAR_TIMES[task_id].replace(" 00:00Z", ""), scheduled
    shown = pgtaskd("show", task_id, "--json", dsn=far_tasks)
    assert shown.returncode == 0, shown.stderr
    assert isinstance(json.loads(shown.stdout)["scheduled_time"], str)


def test_list_and_stats_show_tasks_with_times_python_cannot_hold(far_tasks):
    for command in (["list"], ["list", "--json"], ["stats"], ["stats", "--json"]):
        result = pgtaskd(*command, dsn=far_tasks)
        assert (result.returncode, result.stderr) == (0, ""), (command, result.stderr)
        if command[0] == "list":
            assert all(task_id in result.stdout for task_id in [*FAR_TIMES, "plain"])
        if command == ["stats", "--json"]:
            json.loads(result.stdout, parse_constant=lambda name: pytest.fail(name))


def test_a_time_just_before_year_1_prints_in_a_session_zone_east_of_utc(far_tasks):
    """Loaded in Asia/Tokyo, 0001-12-31 23:00 BC (UTC) is a time of year 1, and the UTC that
    list and show printed it in was an OverflowError."""
    tokyo = {"PGTZ": "Asia/Tokyo"}
    far_tasks_conn = psycopg.connect(far_tasks, autocommit=True)
    with far_tasks_conn:
        far_tasks_conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) VALUES "
                               "('eve', 'eve', 'echo', '0001-12-31 23:00:00+00 BC')")
    for command in (["list"], ["list", "--json"], ["show", "eve"], ["show", "eve", "--json"]):
        result = pgtaskd(*command, dsn=far_tasks, env=tokyo)
        assert (result.returncode, result.stderr) == (0, ""), (command, result.stderr)
        assert "0001-01-01T08:" in result.stdout, (command, result.stdout)


def run_to_full_disk(*args: str, dsn: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PGTASKD_DSN": dsn}
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, env=environment, timeout=60)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_that_cannot_be_written_is_one_line_and_a_submit_says_it_was_made(db_dsn,
                                                                                  conn):
    """Every command's output to a full disk was a traceback; after a submit's, the task
    existed, so a script retrying on the error enqueued it twice."""
    made = run_to_full_disk("submit", "echo", dsn=db_dsn)
    (task_id,) = [r[0] for r in conn.execute("SELECT id FROM tasks")]
    assert made.returncode == 1 and "Traceback" not in made.stderr
    assert made.stderr.splitlines() == [
        f"error: task {task_id} was submitted, but its id could not be written (No space left "
        "on device); do not submit it again without --id"]
    for command in (["list"], ["stats", "--json"], ["show", task_id], ["submit", "echo",
                                                                       "--id", task_id]):
        result = run_to_full_disk(*command, dsn=db_dsn)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.splitlines() == [
            "error: could not write the output: No space left on device"], command
