"""Running the pgtaskd console script as an operator does, for the CLI tests: a real
subprocess, a real PostgreSQL, and helpers that check what it printed and left."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml

from conftest import TEST_HANDLERS, scratch_database
from supervisor import Client

COMMANDS = ["submit", "cancel", "retry", "purge", "show", "list", "stats", "migrate",
            "check-config", "pause", "resume", "schedules", "daemons"]
COLUMNS = ["id", "name", "task_type", "payload", "priority", "scheduled_time", "status",
           "retry_count", "max_retries", "created_at", "updated_at", "claimed_by", "lease_until",
           "error_message", "lease_token", "attempts", "started_at", "finished_at",
           "unique_key", "cpu_seconds", "peak_rss_bytes", "slot", "staged"]


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



def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

