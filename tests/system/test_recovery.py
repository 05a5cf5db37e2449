"""Recovery the supervisor enforces (issue 8), on real daemons with real signals: a hard
timeout per task type, cancellation that kills, worker recycling, what each run cost, and
no process a handler started outliving its task."""

from __future__ import annotations

import os
import time

from conftest import add_task, task_row, wait_until
from daemon import HANDLER_TYPES, metric_sum, pid_alive
from pgcluster import free_port
from supervisor import Client

pytest_plugins = ["daemon"]

TYPES = {**HANDLER_TYPES,
         "overrun": {"handler": "recovery_handlers:overrun", "timeout": 1},
         "overrun_cooperatively": {"handler": "recovery_handlers:overrun_cooperatively",
                                   "timeout": 1},
         "killable": {"handler": "recovery_handlers:overrun", "cancel": "kill"},
         "burn": "recovery_handlers:burn",
         "leak": "recovery_handlers:leak",
         "abandon": "recovery_handlers:abandon"}


def runs(conn, task_id: str) -> list[tuple[int]]:
    return conn.execute("SELECT pid FROM test_runs WHERE task_id = %s ORDER BY at",
                        (task_id,)).fetchall()


def finished(conn, task_id: str) -> bool:
    return task_row(conn, task_id)["status"] in ("COMPLETED", "FAILED", "CANCELLED")


# -- hard timeouts -----------------------------------------------------------------------------


def test_a_run_past_its_timeout_is_stopped_counted_and_its_child_replaced(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 1}}, handlers={"types": TYPES})
    add_task(conn, "slow", "overrun", {"seconds": 60}, max_retries=1)
    wait_until(lambda: finished(conn, "slow"), timeout=30, message="two timed-out runs")
    stored = task_row(conn, "slow")
    assert (stored["status"], stored["retry_count"]) == ("FAILED", 1), stored
    assert "timed out after 1 s" in stored["error_message"]
    first, second = runs(conn, "slow")
    assert first != second, "the child that overran was not replaced"
    assert len(d.find("task_timed_out", task_id="slow")) == 2
    # The handler ignored the news: each run took the timeout plus the grace, then SIGKILL.
    assert len(d.find("worker_stop_timeout")) == 2


def test_a_cooperative_handler_told_of_its_timeout_records_the_failure_itself(start_daemon,
                                                                              conn):
    d = start_daemon(pools={"default": {"processes": 1}}, handlers={"types": TYPES})
    started = time.monotonic()
    add_task(conn, "coop", "overrun_cooperatively", {"seconds": 60}, max_retries=0)
    wait_until(lambda: finished(conn, "coop"), timeout=20, message="the timed-out run")
    assert time.monotonic() - started < 5, "it waited for the kill instead of stopping"
    stored = task_row(conn, "coop")
    assert stored["status"] == "FAILED"
    assert stored["error_message"].startswith("TaskTimedOut: timed out after 1 s")
    assert not d.find("worker_stop_timeout")
    d.wait_for("worker_spawned", count=2)  # the child that ran it is replaced all the same


# -- cancel: kill ------------------------------------------------------------------------------


def test_cancelling_a_kill_type_stops_its_child_within_a_second(start_daemon, conn, db_dsn,
                                                                tmp_path):
    d = start_daemon(pools={"default": {"processes": 1}}, handlers={"types": TYPES},
                     lease={"seconds": 30, "renew_interval": 10})
    d.wait_for("wakeups_listening")
    add_task(conn, "doomed", "killable", {"seconds": 300})
    wait_until(lambda: runs(conn, "doomed"), message="the run to start")
    (pid,) = runs(conn, "doomed")[0]
    cancelled = time.monotonic()
    with Client(db_dsn) as client:
        client.cancel("doomed")
    wait_until(lambda: not pid_alive(pid), timeout=5, interval=0.01,
               message="the child running the cancelled task to die")
    took = time.monotonic() - cancelled
    assert took < 1.0, f"the child died {took:.2f} s after the cancel"
    d.wait_for("task_cancel_killed", task_id="doomed")
    assert task_row(conn, "doomed")["status"] == "CANCELLED"
    d.wait_for("worker_spawned", count=2)
    assert len(runs(conn, "doomed")) == 1


# -- recycling ---------------------------------------------------------------------------------


def test_children_recycle_after_max_tasks_per_child_and_nothing_is_lost(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 2, "max_tasks_per_child": 3}},
                     handlers={"types": TYPES}, metrics={"listen": f"127.0.0.1:{free_port()}"})
    for n in range(24):
        add_task(conn, f"r{n}", "record")
    wait_until(lambda: all(finished(conn, f"r{n}") for n in range(24)), timeout=60,
               message="every task")
    pids = conn.execute("SELECT pid, count(*) FROM test_runs GROUP BY pid").fetchall()
    assert sum(count for _, count in pids) == 24, "a task ran twice or not at all"
    assert all(count <= 4 for _, count in pids), pids  # 3, give or take 10%, per child
    assert len(pids) >= 6
    assert len(d.find("worker_recycling")) >= 5
    assert not d.find("worker_exited", level="error")
    assert metric_sum(d.metrics(), "pgtaskd_workers_recycled_total") >= 5


def test_a_child_over_max_memory_mb_after_a_task_is_replaced(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 1, "max_memory_mb": 80}},
                     handlers={"types": TYPES})
    add_task(conn, "fat", "leak", {"mb": 120})
    add_task(conn, "next", "record")
    wait_until(lambda: finished(conn, "fat") and finished(conn, "next"), timeout=30,
               message="both tasks")
    recycled = d.wait_for("worker_recycling")
    assert "max_memory_mb" in recycled["reason"]
    assert runs(conn, "fat") != runs(conn, "next"), "the next task ran in the fat child"


# -- what each run cost --------------------------------------------------------------------------


def test_each_run_records_its_cpu_time_and_peak_memory(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 1}}, handlers={"types": TYPES},
                     metrics={"listen": f"127.0.0.1:{free_port()}"})
    add_task(conn, "heavy", "burn", {"cpu": 0.4, "mb": 150})
    add_task(conn, "light", "burn", {"cpu": 0.0, "mb": 0}, priority=-1)
    wait_until(lambda: finished(conn, "heavy") and finished(conn, "light"), timeout=30,
               message="both tasks")
    heavy, light = task_row(conn, "heavy"), task_row(conn, "light")
    assert heavy["cpu_seconds"] >= 0.35 and light["cpu_seconds"] < 0.2, (heavy, light)
    assert heavy["peak_rss_bytes"] >= 150 * 1024 * 1024
    # The peak is the run's own: the light run after the heavy one is back to the baseline.
    assert light["peak_rss_bytes"] < heavy["peak_rss_bytes"] - 100 * 1024 * 1024
    metrics = d.metrics()
    assert metric_sum(metrics, "pgtaskd_task_cpu_seconds_count", task_type="burn") == 2
    assert metric_sum(metrics, "pgtaskd_task_cpu_seconds_sum", task_type="burn") >= 0.35
    assert metric_sum(metrics, "pgtaskd_task_peak_rss_bytes_count", task_type="burn") == 2


# -- nothing a handler started outlives its task --------------------------------------------------


def test_processes_a_handler_abandons_are_killed_when_its_task_ends(start_daemon, conn,
                                                                    tmp_path):
    d = start_daemon(pools={"default": {"processes": 1}}, handlers={"types": TYPES})
    pids_file = tmp_path / "pids"
    add_task(conn, "leaver", "abandon", {"pids": str(pids_file), "detach": True})
    wait_until(lambda: finished(conn, "leaver"), message="the task")
    child, detached = map(int, pids_file.read_text().split())
    wait_until(lambda: not pid_alive(child) and not pid_alive(detached), timeout=5,
               message="the abandoned subprocess and the detached grandchild to be gone")
    assert task_row(conn, "leaver")["status"] == "COMPLETED"
    assert d.find("leftover_processes_killed", task_id="leaver")
    (worker,) = d.children()
    assert os.getpgid(worker) == worker


# -- failed attempts ---------------------------------------------------------------------------


def test_a_crash_and_timeouts_are_recorded_as_failed_attempts_of_their_kind(start_daemon, conn,
                                                                            db_dsn):
    start_daemon(pools={"default": {"processes": 3}}, handlers={"types": TYPES})
    add_task(conn, "crash", "suicide", max_retries=0)
    add_task(conn, "overrun", "overrun", {"seconds": 60}, max_retries=0)
    add_task(conn, "coop", "overrun_cooperatively", {"seconds": 60}, max_retries=0)
    wait_until(lambda: all(finished(conn, t) for t in ("crash", "overrun", "coop")),
               timeout=30, message="the three runs to fail")
    with Client(db_dsn) as client:
        (crash,), (overrun,), (coop,) = (client.failed_attempts(t)
                                         for t in ("crash", "overrun", "coop"))
    assert (crash["outcome"], crash["signal"], crash["attempt"]) == ("crashed", "SIGKILL", 1)
    assert "died (SIGKILL" in crash["message"] and crash["worker_id"], crash
    # It ignored the news: killed once the grace ran out.
    assert (overrun["outcome"], overrun["signal"]) == ("timeout", "SIGKILL"), overrun
    assert "timed out after 1 s" in overrun["message"]
    # It stopped when told: its worker recorded the failure, and where the handler was.
    assert (coop["outcome"], coop["signal"], coop["error_type"]) == (
        "timeout", None, "supervisor.errors.TaskTimedOut"), coop
    assert "in overrun_cooperatively" in coop["traceback"], coop["traceback"]
    assert coop["traceback"].endswith("TaskTimedOut: timed out after 1 s\n")
