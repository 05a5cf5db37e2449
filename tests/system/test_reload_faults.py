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


def test_a_failed_reload_shows_in_status_healthz_and_metrics_until_one_succeeds(
        start_daemon, tmp_path):
    """18.5: systemd got READY, and the STATUS line, /healthz and the metrics did not change;
    only the log said reload_failed. Counters exist at zero from the start (18.6)."""
    import socket

    from daemon import metric_sum
    from pgcluster import free_port

    notify_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.setblocking(False)
    d = start_daemon(pools={"default": {"processes": 1}},
                     metrics={"listen": f"127.0.0.1:{free_port()}"},
                     env={"NOTIFY_SOCKET": str(notify_path)})
    samples = d.metrics()
    assert metric_sum(samples, "pgtaskd_reloads_total", outcome="failed") == 0
    assert metric_sum(samples, "pgtaskd_tasks_claimed_total", task_type="echo") == 0, \
        "a counter of a known type is there before its first event"
    good = dict(d.tree)

    statuses: list[str] = []

    def status_seen(text: str) -> bool:
        while True:
            try:
                message = sock.recv(65536).decode()
            except BlockingIOError:
                break
            statuses.extend(line for line in message.split("\n") if line.startswith("STATUS="))
        return any(text in line for line in statuses)

    mark = d.mark()
    d.write_raw_config("pools: [this is not: a mapping\n")
    d.send(signal.SIGHUP)
    d.wait_for("reload_failed", since=mark)
    wait_until(lambda: status_seen("RELOAD FAILED: invalid config"), message="the STATUS line")
    code, report = d.healthz()
    assert code == 200 and report["warnings"]["reload"].startswith(
        "the last reload failed: invalid config"), report
    assert report["config_generation"] == 1
    samples = d.metrics()
    assert metric_sum(samples, "pgtaskd_reloads_total", outcome="failed") == 1
    assert metric_sum(samples, "pgtaskd_reload_failed") == 1
    assert metric_sum(samples, "pgtaskd_config_generation") == 1

    mark = d.mark()
    d.write_config(good)
    d.send(signal.SIGHUP)
    d.wait_for("reload_finished", since=mark, timeout=30)
    wait_until(lambda: d.healthz()[1]["warnings"] == {}, message="the warning to clear")
    assert d.healthz()[1]["config_generation"] == 2
    samples = d.metrics()
    assert metric_sum(samples, "pgtaskd_reloads_total", outcome="succeeded") == 1
    assert metric_sum(samples, "pgtaskd_reload_failed") == 0
    wait_until(lambda: status_seen("") and "RELOAD FAILED" not in statuses[-1],
               message="a STATUS line without the failure")
    sock.close()
