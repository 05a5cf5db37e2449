"""DSNs printed without passwords, and the child-to-parent pipe's line protocol."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, strategies as st

from supervisor.channel import MAX_MESSAGE, ChildChannel, LineReader
from supervisor.db.connect import connection_failure, describe_target, redact_dsn


@pytest.mark.parametrize("dsn, expected", [
    ("postgresql://app:s3cret@db.example:5432/tasks",
     "postgresql://app:***@db.example:5432/tasks"),
    ("postgres://:s3cret@db/tasks", "postgres://:***@db/tasks"),
    ("postgresql://app:s3/cr:et@db/tasks", "postgresql://app:***@db/tasks"),
    ("postgresql://app:s3cret@h1:5432,h2:5433/tasks", "postgresql://app:***@h1:5432,h2:5433/tasks"),
    ("postgresql://app@db/tasks?password=s3cret&sslmode=require",
     "postgresql://app@db/tasks?password=***&sslmode=require"),
    ("postgresql://db/tasks?sslmode=require&PASSWORD=s3cret",
     "postgresql://db/tasks?sslmode=require&PASSWORD=***"),
    ("host=db password=s3cret user=app", "host=db password=*** user=app"),
    ("host=db password = 's3 cr\\'et' user=app", "host=db password = *** user=app"),
    ("PASSWORD=s3cret host=db", "PASSWORD=*** host=db"),
])
def test_redact_dsn_hides_the_password_and_keeps_the_rest(dsn, expected):
    assert redact_dsn(dsn) == expected
    assert "s3" not in redact_dsn(dsn)


@pytest.mark.parametrize("dsn", ["postgresql://app@db:5432/tasks", "host=db user=app dbname=t",
                                 "postgresql://db/tasks?sslmode=require"])
def test_redact_dsn_leaves_a_dsn_without_password_alone(dsn):
    assert redact_dsn(dsn) == dsn


def test_no_dsn_means_the_embedded_server():
    assert redact_dsn(None) == "(embedded)"
    assert redact_dsn("") == "(embedded)"


def test_describe_target_names_host_port_and_database_only():
    assert describe_target("postgresql://app:s3cret@db:6543/tasks") == "db:6543/tasks"
    assert describe_target("host=db password=s3cret dbname=tasks") == "db:5432/tasks"


def test_a_connection_failure_message_never_carries_the_password():
    dsn = "postgresql://app:s3cret@db:5432/tasks"
    error = connection_failure(dsn, Exception(f"connection failed: could not reach {dsn}"))
    assert "s3cret" not in str(error)
    assert str(error).startswith("cannot connect to PostgreSQL at db:5432/tasks: ")


# -- the channel ------------------------------------------------------------------------------

def encode(*messages: dict) -> bytes:
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)


def test_a_message_split_across_reads_comes_out_whole_once():
    reader = LineReader()
    data = encode({"kind": "claimed", "task_id": "t1", "token": 7})
    assert reader.feed(data[:5]) == []
    assert reader.feed(data[5:-1]) == []
    assert reader.feed(data[-1:]) == [{"kind": "claimed", "task_id": "t1", "token": 7}]
    assert reader.feed(b"") == []


def test_several_messages_in_one_read_come_out_in_order():
    reader = LineReader()
    assert [m["kind"] for m in reader.feed(encode({"kind": "booted"}, {"kind": "claimed"},
                                                  {"kind": "done"}))] == \
        ["booted", "claimed", "done"]


def test_torn_and_foreign_lines_are_skipped_without_losing_the_next_message():
    reader = LineReader()
    torn = encode({"kind": "claimed", "task_id": "t1"})[:12] + b"\n"
    foreign = b"Traceback (most recent call last):\n\n[1, 2]\n{\"no_kind\": 1}\n"
    messages = reader.feed(torn + foreign + encode({"kind": "done", "task_id": "t2"}))
    assert messages == [{"kind": "done", "task_id": "t2"}]


def test_invalid_utf8_does_not_break_the_reader():
    reader = LineReader()
    assert reader.feed(b"\xff\xfe\n" + encode({"kind": "done"})) == [{"kind": "done"}]


@given(st.lists(st.fixed_dictionaries({"kind": st.sampled_from(["claimed", "done"]),
                                       "task_id": st.text(max_size=20)}), max_size=8),
       st.lists(st.integers(min_value=0, max_value=400), max_size=10))
def test_any_chunking_of_the_stream_gives_the_same_messages(messages, cuts):
    data = encode(*messages)
    reader = LineReader()
    received = []
    start = 0
    for cut in sorted({min(c, len(data)) for c in cuts}) + [len(data)]:
        received += reader.feed(data[start:cut])
        start = cut
    assert received == messages


def test_child_channel_writes_lines_the_reader_understands():
    read_fd, write_fd = os.pipe()
    try:
        channel = ChildChannel(write_fd)
        channel.send("claimed", task_id="t1", token=3)
        channel.send("done", task_id="t1", outcome="completed")
        assert LineReader().feed(os.read(read_fd, 65536)) == [
            {"kind": "claimed", "task_id": "t1", "token": 3},
            {"kind": "done", "task_id": "t1", "outcome": "completed"}]
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_child_channel_drops_a_message_too_long_to_write_atomically():
    # A torn write could interleave with the lease thread's; raising would abort the run of
    # a task already claimed. Dropping it leaves the claim to the lease's expiry instead.
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    try:
        channel = ChildChannel(write_fd)
        channel.send("claimed", task_id="x" * MAX_MESSAGE, token=1)
        channel.send("done", task_id="t1")
        assert LineReader().feed(os.read(read_fd, 65536)) == [{"kind": "done", "task_id": "t1"}]
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_child_channel_outlives_a_dead_parent():
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    channel = ChildChannel(write_fd)
    try:
        channel.send("done", task_id="t1")
        assert channel.fd is None
        channel.send("done", task_id="t2")
    finally:
        os.close(write_fd)


def test_a_channel_without_a_pipe_sends_nothing():
    ChildChannel(None).send("booted", pid=1)
