"""A kill during a reload is settled by the settings it was made under, whatever the new
config says (issue 15, item 1): a real daemon, a real SIGHUP."""

from __future__ import annotations

import signal

import pytest

from conftest import add_task, task_row, wait_until
from daemon_checks import wait_running_title

pytest_plugins = ["daemon"]

pytestmark = pytest.mark.slow


def test_a_reload_that_removes_reload_timeout_settles_the_kill_it_made(start_daemon, conn):
    d = start_daemon(reload_timeout=1, pools={"default": {"processes": 1}})
    add_task(conn, "long", "sleep", {"seconds": 60}, max_retries=0)
    wait_until(lambda: task_row(conn, "long")["status"] == "RUNNING", message="the task to run")
    (pid,) = d.children()
    wait_running_title(pid, "long")
    mark = d.mark()
    tree = dict(d.tree)
    del tree["reload_timeout"]
    d.write_config(tree)
    d.send(signal.SIGHUP)
    d.wait_for("worker_exited", since=mark, child_pid=pid, timeout=20)
    wait_until(lambda: task_row(conn, "long")["status"] == "FAILED", timeout=20,
               message="the killed run to be settled")
    assert "outlasted reload_timeout (1 s) during a reload" in task_row(conn, "long")["error_message"]
    assert d.returncode() is None, d.log_tail()
