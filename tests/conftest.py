"""Shared fixtures: a real PostgreSQL for the run, a fresh database per test.

By default the run starts its own throwaway server (tests/pgcluster.py). With
PGTASKD_TEST_DSN set (a role that may CREATE DATABASE), it uses that server instead. Either
way each test gets its own database cloned from a migrated template, so tests never see each
other's rows.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
import warnings
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent
sys.path.insert(0, str(TESTS_DIR))

from pgcluster import ThrowawayPostgres  # noqa: E402

from supervisor.config import parse_config  # noqa: E402
from supervisor.db import store  # noqa: E402
from supervisor.db.migrate import migrate  # noqa: E402

TEMPLATE_DB = "pgtaskd_test_template"
TEST_HANDLERS = TESTS_DIR / "handlers"

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
# The integration tests' shared helpers assert too; test modules import them before pytest
# would otherwise get to rewrite them.
pytest.register_assert_rewrite("worker_fixtures", "daemon", "executions")


def dsn_for(admin_dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = dbname
    return make_conninfo(**params)


@pytest.fixture(scope="session")
def pg_admin_dsn():
    """DSN of a role that can create databases, on the server this run uses."""
    external = os.environ.get("PGTASKD_TEST_DSN")
    if external:
        yield external
        return
    # Not under tmp_path_factory: every pytest session of this user resets pytest's temp root
    # to mode 0700, which locks the unprivileged server user out of a data dir kept there and
    # crashes this run's server whenever another run starts.
    server = ThrowawayPostgres()
    server.init()
    server.start()
    try:
        yield server.dsn()
    finally:
        server.destroy()


@pytest.fixture
def own_postgres():
    """A PostgreSQL server of this test's own, which the test may stop and start (never the
    machine's server). Request it before a daemon fixture: it is torn down after them."""
    server = ThrowawayPostgres()
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def template_db(pg_admin_dsn):
    """A database with the pgtaskd schema, cloned for each test (faster than migrating)."""
    name = f"{TEMPLATE_DB}_{os.getpid()}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(dsn_for(pg_admin_dsn, name), autocommit=True) as conn:
        migrate(conn)
        # Where the test handlers (tests/handlers/basic.py) record each run they make.
        conn.execute("CREATE TABLE test_runs (task_id TEXT, worker_id TEXT, retry_count INT, "
                     "pid INT, at TIMESTAMPTZ DEFAULT clock_timestamp())")
    yield name
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_database(admin_dsn: str, prefix: str, template: str | None = None):
    """A new database (a clone of ``template`` if given) for as long as the block runs."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    clone = f' TEMPLATE "{template}"' if template else ""
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"{clone}')
    try:
        yield dsn_for(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_dsn(pg_admin_dsn, template_db):
    """A fresh, migrated database for one test; dropped afterwards."""
    with scratch_database(pg_admin_dsn, "pgtaskd_t", template_db) as dsn:
        yield dsn


@pytest.fixture
def empty_db_dsn(pg_admin_dsn):
    """A fresh database without the schema, for migration tests."""
    with scratch_database(pg_admin_dsn, "pgtaskd_e") as dsn:
        yield dsn


@pytest.fixture
def conn(db_dsn):
    with psycopg.connect(db_dsn, autocommit=True) as connection:
        yield connection


def make_config(dsn: str | None = None, **tree):
    """A Config for tests: fast leases and retries, the test handlers, overridable by key."""
    base = {
        "database": {"dsn": dsn} if dsn else {},
        "lease": {"seconds": 30, "renew_interval": 10},
        "poll_interval": 0.05,
        "retry": {"base_delay": 0.0, "max_delay": 0.0, "jitter": 0.0},
        "handlers": {"path": str(TEST_HANDLERS), "types": {
            "echo": "basic:echo", "record": "basic:record", "fail": "basic:fail",
            "permanent": "basic:permanent", "sleep": "basic:sleep",
            "record_then_sleep": "basic:record_then_sleep",
            "cooperative": "basic:cooperative",
        }},
    }
    for key, value in tree.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return parse_config(base, base_dir=TESTS_DIR, env={})


@pytest.fixture
def config_for():
    return make_config


def add_task(conn, task_id: str, task_type: str = "echo", payload: dict | None = None,
             **fields) -> str:
    """Insert a PENDING task through the store, as any client would."""
    inserted = store.insert_task(conn, task_id=task_id, name=f"test {task_id}",
                                 task_type=task_type, payload=payload or {}, **fields)
    assert inserted, f"task {task_id} existed already"
    return task_id


def task_row(conn, task_id: str) -> dict:
    row = store.get_task(conn, task_id)
    assert row is not None, f"task {task_id} is gone"
    return row


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """YAML whose last anchor expands to width**levels strings ("billion laughs"), placed
    where a config problem would quote it: the expanded value takes gigabytes."""
    lines = ["x:", "  a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    for level in range(1, levels):
        lines.append(f"  a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    lines += ["handlers:", "  types:", f"    bomb: *a{levels - 1}", ""]
    return "\n".join(lines)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, message: str = ""):
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message or predicate}")
        time.sleep(interval)
