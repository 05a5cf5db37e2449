"""A daemon whose path to PostgreSQL is slow: every round trip takes 0.4 s (a TCP proxy holds
each exchange), with ``database.connect_timeout`` at 1 s.

A bare connection (two round trips) gets through in time, but a child's pool connects and
then configures its first connection (two more), 1.6 s in all. Found by the slow-host
scenario (tests/faults/test_hosts.py): the child died at boot with a traceback
(``PoolTimeout: pool initialization incomplete``), and every child that replaced it did the
same, so the daemon never ran a task. A slow path is not a broken child: it waits, as for a
database that is down, and boots.
"""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from conftest import wait_until
from supervisor import Client
from tcpproxy import TcpProxy

pytest_plugins = ["daemon"]


@pytest.fixture
def proxy(db_dsn):
    """Request it before start_daemon: it closes after the daemon is gone."""
    params = conninfo_to_dict(db_dsn)
    with TcpProxy(params.get("host") or "127.0.0.1", int(params.get("port") or 5432)) as relay:
        yield relay


def test_a_child_whose_pool_opens_slower_than_connect_timeout_waits_and_boots(
        proxy, start_daemon, conn, db_dsn):
    slow_dsn = make_conninfo(db_dsn, host="127.0.0.1", port=str(proxy.port))
    daemon = start_daemon(dsn=slow_dsn, wait_ready=False, database={"connect_timeout": 1},
                          pools={"default": {"processes": 1}})
    # Slow from the child's spawn on, before its interpreter has even loaded: the
    # supervisor's own start (its migrations check) would take seconds more through it.
    daemon.wait_for("worker_spawned", timeout=30)
    proxy.latency = 0.4
    daemon.wait_for("worker_booted", timeout=60)
    assert daemon.find("db_unreachable"), "the pool opened in time: nothing was tested"
    with Client(db_dsn) as client:
        client.submit("echo", {}, task_id="t0")
    wait_until(lambda: conn.execute("SELECT status FROM tasks WHERE id = 't0'").fetchone()[0]
               == "COMPLETED", timeout=30, message="the task to complete")
    assert not daemon.other_lines, daemon.other_lines[:5]
    assert not daemon.find("worker_exited"), daemon.log_tail()
