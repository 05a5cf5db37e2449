"""No part of a password reaches a connection error, whatever shape the DSN has: each
attempt goes to a closed port on 127.0.0.1 and libpq's real message is checked."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secret_dsns import SECRET_STEM, dsn_shapes, passwords
from supervisor.db.connect import connect
from supervisor.errors import OperationalError


@pytest.fixture(scope="module")
def closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def pinned(monkeypatch, closed_port):
    """Host names and ports that libpq reads out of a misread password still lead to the
    closed port on 127.0.0.1: no DNS lookup, no other server."""
    monkeypatch.setenv("PGHOSTADDR", "127.0.0.1")
    monkeypatch.setenv("PGPORT", str(closed_port))
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "1")
    return closed_port


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(passwords(), st.sampled_from(list(dsn_shapes("x", 1))))
def test_a_connection_failure_never_quotes_a_part_of_the_password(pinned, password, shape):
    dsn = dsn_shapes(password, pinned)[shape]
    with pytest.raises(OperationalError) as caught:
        connect(dsn, connect_timeout=1)
    message = str(caught.value)
    assert message.startswith("cannot connect to PostgreSQL at "), message
    assert SECRET_STEM not in message, (dsn, message)
    assert "\n" not in message
