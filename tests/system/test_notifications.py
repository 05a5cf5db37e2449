"""Notifications are hints (issue 15, items 3 and 4; issue 14, item 4): any login may NOTIFY
pgtaskd_tasks with any payload, so the daemon checks the database before it acts on a cancel,
and no payload ends its listener; a real cancel reaches the child holding the claim at once.
Real daemons; every execution recorded outside the database."""

from __future__ import annotations

import json

import pytest

from conftest import add_task, task_row, wait_until
from daemon import HANDLER_TYPES
from daemon_checks import assert_quiet, wait_running_title
from executions import read_runs
from supervisor import Client

pytest_plugins = ["daemon"]

pytestmark = pytest.mark.slow


def notify(conn, payload) -> None:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    conn.execute("SELECT pg_notify('pgtaskd_tasks', %s)", (text,))


def test_a_forged_cancel_notification_kills_nothing(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 1}}, handlers={
        "types": {**HANDLER_TYPES, "sleep": {"handler": "basic:sleep", "cancel": "kill"}}})
    add_task(conn, "victim", "sleep", {"seconds": 60})
    wait_until(lambda: task_row(conn, "victim")["status"] == "RUNNING", message="the run")
    (pid,) = d.children()
    wait_running_title(pid, "victim")
    mark = d.mark()
    notify(conn, {"cancelled": "victim", "schema": "public"})
    assert_quiet(d, 2.0, mark, "task_cancel_killed")
    assert d.children() == [pid]
    assert task_row(conn, "victim")["status"] == "RUNNING"


ODD_PAYLOADS = ['{"due": 1e999}', '{"due": "lots", "delay": 1e999}',
                '{"delay": -1e999, "types": [1, null, {}]}', '[1, 2]', '"text"',
                '{"cancelled": {"id": 1}}', "not json", "[" * 7_000]


def test_no_payload_ends_the_listener(start_daemon, conn):
    """Polling is slow here (30 s): only a wake-up runs each task within the deadline. One
    daemon takes every odd payload in turn, each followed by a task that must run."""
    d = start_daemon(poll_interval=30, pools={"default": {"processes": 1}})
    d.wait_for("wakeups_listening")
    mark = d.mark()
    for n, payload in enumerate(ODD_PAYLOADS):
        notify(conn, payload)
        add_task(conn, f"after{n}", "echo")
        wait_until(lambda: task_row(conn, f"after{n}")["status"] == "COMPLETED", timeout=10,
                   message=f"a wake-up after the odd notification {payload[:40]!r}")
    assert d.find("wakeups_unavailable", since=mark) == []


def test_a_task_cancelled_while_it_waits_in_a_batch_never_starts(start_daemon, conn, tmp_path):
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(pools={"default": {"processes": 1, "batch_size": 3}})
    with conn.transaction():
        for name, priority in (("head", 9), ("waiting", 8), ("last", 7)):
            add_task(conn, name, "gated", {"log": str(log), "gate": str(gate)},
                     priority=priority)
    wait_until(lambda: any(r["task_id"] == "head" for r in read_runs(log)),
               message="the head of the batch to start")
    assert task_row(conn, "waiting")["status"] == "RUNNING"  # claimed with the head
    mark = d.mark()
    Client(d.dsn).cancel("waiting")
    d.wait_for("cancel_relayed", since=mark, task_id="waiting", timeout=5)
    gate.touch()
    wait_until(lambda: task_row(conn, "last")["status"] == "COMPLETED", timeout=20,
               message="the rest of the batch to run")
    assert [r["task_id"] for r in read_runs(log)] == ["head", "last"]
    assert task_row(conn, "waiting")["status"] == "CANCELLED"
