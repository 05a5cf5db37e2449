"""Input the CLI refuses: an unreachable or unmigrated database, bad arguments and configs,
and properties over generated command lines: one line on stderr, no traceback, nothing
written."""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.cli import parse_duration
from supervisor.client import STATUSES
from cli_runs import (assert_refused, free_port, pgtaskd, row, shared_conn,  # noqa: F401
                      shared_dsn, task_count)


# --- bad input --------------------------------------------------------------------------------



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

