"""The supervisor never runs a task twice or kills it on a reload, and never blocks on the
database (issue 10), on real daemons with real signals.

- A reload or a shrink lets a running task finish however long it takes; only an explicit
  reload_timeout kills it, and then the killed run counts as a failed attempt.
- Leases are renewed by the supervisor, so a handler holding the GIL past its lease is still
  the task's only execution.
- With the database path frozen (a proxy that accepts and never answers), the main loop keeps
  pinging the watchdog, handles signals and restarts dead children.

Executions are recorded outside the database (tests/handlers/timed_handlers.py).
"""

from __future__ import annotations

import os
import signal
import time

from conftest import add_task, task_row, wait_until
from notify_socket import NotifySocket, longest_gap
from tcpproxy import TcpProxy
from executions import read_runs

from psycopg.conninfo import conninfo_to_dict, make_conninfo

pytest_plugins = ["daemon"]


def timed_task(conn, task_id: str, log, seconds: float, task_type: str = "sleeps", **fields):
    add_task(conn, task_id, task_type, {"log": str(log), "seconds": seconds}, **fields)


def finished(conn, task_id: str) -> bool:
    return task_row(conn, task_id)["status"] in ("COMPLETED", "FAILED", "CANCELLED")


# -- 1. reloads and shrinks wait for the running task ---------------------------------------


def test_a_reload_lets_a_task_longer_than_the_shutdown_timeout_finish(start_daemon, conn,
                                                                        tmp_path):
    log = tmp_path / "runs.log"
    d = start_daemon(pools={"default": {"processes": 1}}, shutdown_timeout=1)
    timed_task(conn, "long", log, seconds=6)
    wait_until(lambda: read_runs(log), message="the run to start")

    # A reload every 1.5 s while it runs, as a config-management tool might do.
    for _ in range(3):
        mark = d.mark()
        d.send(signal.SIGHUP)
        d.wait_for("reload_finished", since=mark)
        time.sleep(1.5)
    wait_until(lambda: finished(conn, "long"), timeout=30, message="the task to finish")

    runs = read_runs(log)
    assert len(runs) == 1 and runs[0]["end"] is not None, runs
    stored = task_row(conn, "long")
    assert (stored["status"], stored["attempts"], stored["retry_count"]) == ("COMPLETED", 1, 0)
    assert not d.find("worker_stop_timeout")


def test_a_shrink_lets_the_running_task_finish(start_daemon, conn, tmp_path):
    log = tmp_path / "runs.log"
    d = start_daemon(pools={"default": {"processes": 1}}, shutdown_timeout=1)
    timed_task(conn, "long", log, seconds=4)
    wait_until(lambda: read_runs(log), message="the run to start")
    d.send(signal.SIGTTOU)
    wait_until(lambda: finished(conn, "long"), timeout=30, message="the task to finish")
    assert [run["end"] is not None for run in read_runs(log)] == [True]
    assert task_row(conn, "long")["status"] == "COMPLETED"


def test_a_reload_timeout_kills_the_run_and_counts_it_so_max_retries_ends_it(start_daemon,
                                                                             conn, tmp_path):
    log = tmp_path / "runs.log"
    d = start_daemon(pools={"default": {"processes": 1}}, reload_timeout=1)
    timed_task(conn, "long", log, seconds=60, max_retries=1)
    for attempt in (1, 2):
        wait_until(lambda: len(read_runs(log)) == attempt, timeout=20,
                   message=f"run {attempt} to start")
        mark = d.mark()
        d.send(signal.SIGHUP)
        d.wait_for("worker_stop_timeout", since=mark, timeout=20)
    wait_until(lambda: finished(conn, "long"), timeout=20, message="the task to fail")
    stored = task_row(conn, "long")
    assert (stored["status"], stored["retry_count"]) == ("FAILED", 1), stored
    assert "reload_timeout" in stored["error_message"]
    # Both runs were killed (no "end"); the second began only after the first one's child
    # was gone, since the rescue that let it run again comes after the kill.
    first, second = read_runs(log)
    assert first["pid"] != second["pid"]


# -- 3. a handler that holds the GIL past its lease ------------------------------------------


def test_a_handler_holding_the_gil_past_its_lease_runs_once(start_daemon, conn, tmp_path):
    log = tmp_path / "runs.log"
    # Leases of 2 s, renewed every 0.5 s; a reaper every 0.5 s and a second child ready to take
    # over the task the moment its lease lapses.
    d = start_daemon(pools={"default": {"processes": 2}},
                     lease={"seconds": 2, "renew_interval": 0.5}, reaper={"interval": 0.5})
    timed_task(conn, "gil", log, seconds=6, task_type="holds_the_gil")
    wait_until(lambda: finished(conn, "gil"), timeout=30, message="the task to finish")

    runs = read_runs(log)
    assert len(runs) == 1 and runs[0]["end"] is not None, runs
    assert runs[0]["end"] - runs[0]["start"] >= 5.5
    stored = task_row(conn, "gil")
    assert (stored["status"], stored["attempts"]) == ("COMPLETED", 1), stored
    assert not d.find("lease_expired_task_requeued") and not d.find("stale_result_discarded")
    assert len(d.find("lease_renewed", task_id="gil")) >= 6


def test_a_stopped_child_loses_its_lease_and_its_late_result_is_discarded(start_daemon, conn,
                                                                         tmp_path):
    log = tmp_path / "runs.log"
    d = start_daemon(pools={"default": {"processes": 2}},
                     lease={"seconds": 2, "renew_interval": 0.5}, reaper={"interval": 0.5})
    timed_task(conn, "t1", log, seconds=3)
    first = wait_until(lambda: read_runs(log), message="the first run")[0]
    os.kill(first["pid"], signal.SIGSTOP)
    try:
        # Nobody renews for a stopped child: the lease lapses and the other child runs it.
        wait_until(lambda: len(read_runs(log)) >= 2, timeout=20, message="a second run")
        wait_until(lambda: task_row(conn, "t1")["status"] == "COMPLETED", timeout=20,
                   message="the second run to complete")
    finally:
        os.kill(first["pid"], signal.SIGCONT)
    d.wait_for("stale_result_discarded", task_id="t1", timeout=20)
    assert task_row(conn, "t1")["status"] == "COMPLETED"
    runs = read_runs(log)
    # The first run started a moment after its claim, the lease counts from the claim.
    assert runs[1]["start"] > first["start"] + 2 - 0.1, \
        "the second run began before the lease lapsed"


# -- 2. the main loop never waits on the database -----------------------------------------------


def test_with_the_database_frozen_the_main_loop_keeps_its_pace(start_daemon, conn, db_dsn,
                                                               tmp_path):
    log = tmp_path / "runs.log"
    params = conninfo_to_dict(db_dsn)
    notify = NotifySocket()
    with TcpProxy(params["host"], int(params["port"])) as proxy:
        proxied = make_conninfo(**{**params, "port": str(proxy.port)})
        d = start_daemon(dsn=proxied, env=notify.env, pools={"default": {"processes": 3}},
                         database={"connect_timeout": 2})
        for n in range(3):
            timed_task(conn, f"busy{n}", log, seconds=60)
        wait_until(lambda: len(read_runs(log)) == 3, timeout=20, message="three busy children")
        busy = [run["pid"] for run in read_runs(log)]
        try:
            proxy.freeze()
            frozen_at = time.monotonic()
            mark = d.mark()
            for pid in busy:
                os.kill(pid, signal.SIGKILL)
            for pid in busy:
                d.wait_for("worker_exited", since=mark, child_pid=pid, timeout=10)
            # New children are started though none of them can reach the database.
            d.wait_for("worker_spawned", since=mark, count=3, timeout=10)
            d.send(signal.SIGTTIN)
            d.wait_for("pools_resized", since=mark, timeout=5)
            time.sleep(8)  # a stretch of the frozen outage in which to measure the pings
            gap = longest_gap(notify.pings(), frozen_at, time.monotonic())
            print(f"longest gap between watchdog pings with the database frozen: {gap:.2f} s")
            assert gap <= 2.0, f"no watchdog ping for {gap:.1f} s while the database was frozen"
        finally:
            proxy.thaw()
            notify.close()
        # Once the path is back, the dead children's claims are settled and the tasks rerun.
        wait_until(lambda: all(task_row(conn, f"busy{n}")["attempts"] >= 2 for n in range(3)),
                   timeout=60, message="the dead children's tasks to run again")
