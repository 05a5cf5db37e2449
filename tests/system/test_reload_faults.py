"""Reloads that must not stop the daemon: a kill settled by the settings it was made under
whatever the new config says, and a config whose loading raises something other than a config
problem (issue 15, items 1 and 2). Real daemons, real SIGHUPs."""

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


@pytest.mark.parametrize("folder", ["hand\\ud800lers", "loop/handlers"])
def test_a_reload_whose_paths_cannot_be_resolved_fails_and_keeps_the_daemon(start_daemon,
                                                                            conn, folder):
    """A lone surrogate cannot be encoded for the OS, and a symlink loop cannot be resolved:
    either used to escape Path.resolve() and end the supervisor with its children."""
    d = start_daemon(pools={"default": {"processes": 1}})
    (d.dir / "loop").symlink_to(d.dir / "loop")
    mark = d.mark()
    d.write_raw_config(d.config_path.read_text().replace(
        f"path: {d.tree['handlers']['path']}", f'path: "{folder}"'))
    d.send(signal.SIGHUP)
    failed = d.wait_for("reload_failed", since=mark, timeout=10)
    assert "handlers.path" in " ".join(failed["problems"]), failed
    add_task(conn, "after", "echo")
    wait_until(lambda: task_row(conn, "after")["status"] == "COMPLETED",
               message="the running generation to keep working")
