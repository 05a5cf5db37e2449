"""DSNs printed without passwords, and the supervisor-child link's packets."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from secret_dsns import SECRET_STEM, WELL_FORMED, dsn_shapes, passwords
from supervisor.channel import MAX_PACKET, Link, socket_pair
from supervisor.db.connect import connection_failure, describe_target
from supervisor.db.redact import redact_dsn


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


@pytest.mark.parametrize("dsn, expected", [
    # '/' or '@' typed into a URI's password: libpq reads a host and a database out of it.
    ("postgresql://app:pa/ss@w@rd@127.0.0.1:1/db", "postgresql://app:***@127.0.0.1:1/db"),
    ("postgresql://app:p@ss@db/tasks?sslmode=require",
     "postgresql://app:***@db/tasks?sslmode=require"),
    ("postgresql://app:pa%2Fss%40w%40rd@db/tasks", "postgresql://app:***@db/tasks"),
    # libpq reads a backslash as "the next character as is", and only ASCII white space ends
    # an unquoted value.
    ("host=db password=pa\\ ss user=app", "host=db password=*** user=app"),
    ("host=db password=pa\u00a0ss user=app", "host=db password=*** user=app"),
    ("host=db password='pa ss@w/rd' user=app", "host=db password=*** user=app"),
    # Unreadable DSNs: where the password ends is a guess, so the rest is hidden.
    ("host=db password=pa ss user=app", "host=db password=***"),
    ("postgresql://app@db/t?password=a&b&sslmode=require", "postgresql://app@db/t?password=***"),
    ("host='db password=s3cret", "host='db password=***"),
    # libpq knows no PASSWORD, so it cannot read this DSN.
    ("PASSWORD=s3cret host=db", "PASSWORD=***"),
])
def test_redact_dsn_hides_every_spelling_of_the_password(dsn, expected):
    assert redact_dsn(dsn) == expected


@given(passwords(), st.sampled_from(list(dsn_shapes("x", 1))))
def test_redact_dsn_never_shows_a_part_of_the_password(password, shape):
    dsn = dsn_shapes(password, 5432)[shape]
    redacted = redact_dsn(dsn)
    assert SECRET_STEM not in redacted, (dsn, redacted)
    if shape in WELL_FORMED:
        assert "127.0.0.1" in redacted, (dsn, redacted)


@pytest.mark.parametrize("dsn, message", [
    # A misread URI: libpq and psycopg quote the host they read out of the password.
    ("postgresql://app:S3KRIT0@S3KRIT1@127.0.0.1:1/db",
     "failed to resolve host 'S3KRIT1@127.0.0.1': [Errno -2] Name or service not known"),
    ("postgresql://app:S3KRIT0/S3KRIT1@127.0.0.1:1/db",
     'invalid integer value "S3KRIT0" for connection option "port"'),
    ("postgresql://app:S3KRIT0/S3KRIT1@127.0.0.1:1/db",
     'connection failed: FATAL:  database "S3KRIT1@127.0.0.1:1/db" does not exist'),
    # An unreadable key=value DSN: libpq quotes the word after the password.
    ("host=127.0.0.1 password=S3KRIT0 S3KRIT1 dbname=db",
     'missing "=" after "S3KRIT1" in connection info string'),
])
def test_a_connection_failure_hides_what_libpq_quotes_from_a_doubtful_dsn(dsn, message):
    error = str(connection_failure(dsn, Exception(message)))
    assert error.startswith("cannot connect to PostgreSQL at ") and SECRET_STEM not in error


# -- the link -----------------------------------------------------------------------------------

@pytest.fixture
def link_pair():
    """(supervisor end, child end) of a real socketpair, as the supervisor sets them up."""
    parent_sock, child_sock = socket_pair()
    parent, child = Link(parent_sock, blocking=False), Link(child_sock, blocking=True)
    yield parent, child
    parent.close()
    child.close()


def test_messages_arrive_whole_and_in_order_both_ways(link_pair):
    parent, child = link_pair
    assert child.send("claimed", claims=[["t1", 7, "echo"]], done=[])
    assert child.send("idle", since=1.5, done=[7])
    assert parent.receive() == ([{"kind": "claimed", "claims": [["t1", 7, "echo"]], "done": []},
                                 {"kind": "idle", "since": 1.5, "done": [7]}], True)
    assert parent.send("wake")
    assert parent.send("lease", tokens=[7], expires_at=12.5)
    assert child.receive() == ([{"kind": "wake"}, {"kind": "lease", "tokens": [7],
                                                   "expires_at": 12.5}], True)


def test_receive_never_waits(link_pair):
    parent, child = link_pair
    started = time.monotonic()
    assert child.receive() == ([], True)
    assert parent.receive() == ([], True)
    assert time.monotonic() - started < 0.5


def test_foreign_packets_are_skipped_without_losing_the_next_message(link_pair):
    parent, child = link_pair
    for junk in (b"\xff\xfe", b"Traceback (most recent call last):", b"[1, 2]", b'{"no_kind": 1}'):
        child.sock.send(junk)
    child.send("idle", since=2.0, done=[])
    assert parent.receive() == ([{"kind": "idle", "since": 2.0, "done": []}], True)


def test_a_message_too_large_for_one_packet_is_refused_not_cut(link_pair):
    parent, child = link_pair
    assert not child.send("claimed", claims=[["x" * MAX_PACKET, 1, "echo"]], done=[])
    assert child.send("idle", since=1.0, done=[])
    assert parent.receive() == ([{"kind": "idle", "since": 1.0, "done": []}], True)


def test_the_supervisor_end_drops_what_a_child_does_not_read(link_pair):
    parent, _ = link_pair
    sent = 0
    while parent.send("lease", tokens=list(range(500)), expires_at=1.0):
        sent += 1
        assert sent < 100_000, "a non-blocking send never found the socket full"
    # Full: the next send is dropped at once instead of stalling the supervisor.
    started = time.monotonic()
    assert not parent.send("wake")
    assert time.monotonic() - started < 0.5


def test_either_end_outlives_the_other(link_pair):
    parent, child = link_pair
    parent.close()
    assert child.receive() == ([], False)
    assert not child.send("idle", since=1.0, done=[])
    assert child.closed
    assert not child.send("idle", since=2.0, done=[])


def test_a_link_without_a_socket_sends_nothing():
    link = Link.from_fd(None)
    assert link.closed and not link.send("booted", pid=1)
