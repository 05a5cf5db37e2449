"""A daemon behind PgBouncer in transaction mode (database.transaction_pooler).

Server connections are shared transaction by transaction, so nothing may rely on a session:
no prepared statement, no session setting, no LISTEN. Every task must still run exactly once;
wake-ups come through database.listen_dsn, a direct connection, or else polling does.
"""

from __future__ import annotations

import time

import pytest
from psycopg.conninfo import conninfo_to_dict

from conftest import wait_until
from pgbouncer import BINARY, TransactionPooler
from supervisor import Client

pytest_plugins = ["daemon"]

pytestmark = pytest.mark.skipif(BINARY is None, reason="pgbouncer is not installed "
                                "(.ci/run installs it)")


@pytest.fixture
def pooler(db_dsn):
    params = conninfo_to_dict(db_dsn)
    pooler = TransactionPooler(params["host"], int(params["port"]), pool_size=3)
    pooler.start()
    yield pooler
    pooler.stop()


def completed(conn) -> int:
    return conn.execute("SELECT count(*) FROM tasks WHERE status = 'COMPLETED'").fetchone()[0]


@pytest.mark.parametrize("batch_size", [1, 5])
def test_every_task_runs_once_through_a_transaction_pooler(start_daemon, conn, db_dsn, pooler,
                                                           batch_size):
    dbname = conninfo_to_dict(db_dsn)["dbname"]
    d = start_daemon(dsn=pooler.dsn(dbname), poll_interval=0.2,
                     database={"transaction_pooler": True},
                     pools={"default": {"processes": 3, "batch_size": batch_size}})
    # Without listen_dsn the daemon says once why it polls instead.
    assert d.find("wakeups_unavailable")
    with Client(pooler.dsn(dbname), transaction_pooler=True) as client:
        for n in range(30):  # enough single submits for psycopg to prepare, were it allowed
            client.submit("record", task_id=f"one-{n}")
        client.submit_many({"task_type": "record", "task_id": f"many-{n}"} for n in range(300))
    wait_until(lambda: completed(conn) == 330, timeout=60, message="330 tasks completed")
    runs = conn.execute("SELECT task_id, count(*) FROM test_runs GROUP BY task_id "
                        "HAVING count(*) > 1").fetchall()
    assert runs == [], f"tasks run more than once: {runs[:5]}"
    assert not d.find("loop_error"), d.find("loop_error")[:3]
    assert "prepared statement" not in d.log_tail(400)


def test_wake_ups_come_through_a_direct_listen_dsn(start_daemon, conn, db_dsn, pooler):
    dbname = conninfo_to_dict(db_dsn)["dbname"]
    d = start_daemon(dsn=pooler.dsn(dbname), poll_interval=30,
                     database={"transaction_pooler": True, "listen_dsn": db_dsn})
    d.wait_for("wakeups_listening")
    time.sleep(0.5)  # idle
    started = time.monotonic()
    conn.execute("INSERT INTO tasks (id, name, task_type) VALUES ('woken', 'n', 'record')")
    wait_until(lambda: completed(conn) == 1, timeout=10, interval=0.01, message="the pickup")
    assert time.monotonic() - started < 2.0, "no wake-up: the task waited for the 30 s poll"
