"""What a row or a handler can do to a child's link to its supervisor, and what it must not
(issue 15, items 8, 15, 16 and 19): an id too long for a packet, a handler that ignores
SIGTERM, one that closes the link, one that leaves a thread that keeps the child from exiting,
one that leaves processes where a single thread's list of children does not show them. Real daemons, real signals, real PostgreSQL."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import add_task, task_row, wait_until
from daemon import HANDLER_TYPES, pid_alive
from executions import read_runs
from supervisor.db import store

from supervisor.daemon.children import IDLE_STOP_GRACE

pytestmark = pytest.mark.slow

pytest_plugins = ["daemon"]


def test_ids_too_long_for_one_packet_neither_spin_nor_stall_their_batch(start_daemon, conn):
    """150 ids of 200 emoji are 360 KiB as JSON, over the link's packet in one claim; an id of
    50,000 control characters (plain SQL) is over it alone. The first are claimed in parts
    and run; the second fails once, not released and re-claimed a hundred times a second."""
    emoji = ["\U0001F600" * 197 + f"{i:03d}" for i in range(150)]
    huge = "\x01" * 50_000
    with conn.cursor() as cur:
        for task_id in emoji + [huge]:
            cur.execute("INSERT INTO tasks (id, name, task_type, payload) "
                        "VALUES (%s, 'hostile', 'echo', '{}')", (task_id,))
    d = start_daemon(pools={"default": {"processes": 1, "batch_size": 200}})
    wait_until(lambda: task_row(conn, huge)["status"] == "FAILED", timeout=20,
               message="the task whose id cannot be linked to fail")
    wait_until(lambda: all(task_row(conn, t)["status"] == "COMPLETED" for t in emoji),
               timeout=20, message="the 150 long ids to complete")
    row = task_row(conn, huge)
    assert (row["attempts"], row["retry_count"]) == (1, 0)
    assert "50000 characters" in row["error_message"]
    assert not d.find("batch_released")


HOSTILE_TYPES = {**HANDLER_TYPES, "deaf": "hostile_handlers:ignores_sigterm",
                 "unlinks": "hostile_handlers:closes_descriptors",
                 "threads": "hostile_handlers:leaves_a_thread",
                 "spawns": "hostile_handlers:leaves_processes"}


def test_a_child_whose_handler_ignores_sigterm_still_leaves_on_a_reload(start_daemon, conn,
                                                                        tmp_path):
    """SIGTERM was the only request to stop: each reload left such a child (and its
    connections) running until the daemon stopped."""
    log = tmp_path / "runs.log"
    d = start_daemon(handlers={"types": HOSTILE_TYPES}, pools={"default": {"processes": 1}})
    (old,) = d.children()
    add_task(conn, "deaf-1", "deaf", {"log": str(log), "seconds": 0})
    wait_until(lambda: task_row(conn, "deaf-1")["status"] == "COMPLETED",
               message="the task that sets SIGTERM to SIG_IGN to complete")
    d.send(signal.SIGHUP)
    d.wait_for("reload_finished", timeout=20)
    wait_until(lambda: not pid_alive(old), timeout=5,
               message="the child that ignores SIGTERM to leave after the reload")
    assert old not in d.children()


def test_a_child_whose_link_closed_is_retired_and_its_run_charged(start_daemon, conn,
                                                                 tmp_path):
    """A handler closed every descriptor, the child's link among them: the supervisor heard
    nothing more from it and renewed its lease forever, the task RUNNING for good."""
    log = tmp_path / "runs.log"
    d = start_daemon(handlers={"types": HOSTILE_TYPES},
                     lease={"seconds": 4, "renew_interval": 1},
                     pools={"default": {"processes": 1}})
    (old,) = d.children()
    add_task(conn, "unlinks-1", "unlinks", {"log": str(log), "seconds": 60}, max_retries=0)
    d.wait_for("worker_link_lost", timeout=10, child_pid=old)
    wait_until(lambda: task_row(conn, "unlinks-1")["status"] == "FAILED", timeout=15,
               message="the run of the child that cannot be heard to be charged")
    assert "link to the supervisor closed" in task_row(conn, "unlinks-1")["error_message"]
    (attempt,) = store.failed_attempts(conn, "unlinks-1", limit=20)
    assert (attempt["outcome"], attempt["signal"]) == ("killed", "SIGKILL"), attempt
    assert not pid_alive(old)
    runs = read_runs(log)
    assert [r["task_id"] for r in runs] == ["unlinks-1"]  # not run again behind its back
    add_task(conn, "after", "echo")
    wait_until(lambda: task_row(conn, "after")["status"] == "COMPLETED", timeout=15,
               message="the child that replaced it to run the next task")


def test_a_child_that_cannot_exit_after_a_reload_is_killed_once_it_holds_nothing(
        start_daemon, conn, tmp_path):
    """A thread its handler left keeps the child's interpreter alive after its loop ended:
    the child held nothing, yet stayed until the daemon stopped."""
    log = tmp_path / "runs.log"
    d = start_daemon(handlers={"types": HOSTILE_TYPES}, pools={"default": {"processes": 1}})
    (old,) = d.children()
    add_task(conn, "threads-1", "threads", {"log": str(log)})
    wait_until(lambda: task_row(conn, "threads-1")["status"] == "COMPLETED",
               message="the task that leaves a thread to complete")
    d.send(signal.SIGHUP)
    d.wait_for("worker_stopped", timeout=20, pid=old)
    d.wait_for("worker_stop_unheeded", timeout=IDLE_STOP_GRACE + 5, child_pid=old)
    wait_until(lambda: not pid_alive(old), timeout=5, message="the child to be gone")


def leftover_pids(path) -> list[int]:
    """The pids the three leftovers wrote, once all four shells wrote theirs."""
    try:
        pids = [int(p) for p in path.read_text().split()]
    except FileNotFoundError:
        return []
    return pids if len(pids) == 4 else []


def test_what_a_handler_leaves_dies_after_its_task_from_any_thread_or_shell(start_daemon,
                                                                            conn, tmp_path):
    """Only the main thread's children were killed after a task, and only once: a process
    started from a handler's thread, and the background child of ``sh -c 'x & exec y'``
    (it reached the worker only as its parent was killed), outlived the task."""
    log, pids = tmp_path / "runs.log", tmp_path / "pids"
    start_daemon(handlers={"types": HOSTILE_TYPES}, pools={"default": {"processes": 1}})
    add_task(conn, "spawns-1", "spawns", {"log": str(log), "pids": str(pids)})
    wait_until(lambda: task_row(conn, "spawns-1")["status"] == "COMPLETED",
               message="the task that leaves processes to complete")
    left = wait_until(lambda: leftover_pids(pids), message="the four leftovers' pids")
    wait_until(lambda: not any(pid_alive(p) for p in left), timeout=5,
               message=f"every process the handler left to die: {left}")


def test_what_a_killed_childs_handler_left_in_a_session_of_its_own_dies_too(start_daemon,
                                                                          conn, tmp_path):
    """Killing the child's process group missed a process its handler had put in a session
    of its own: it went to init and outlived the daemon."""
    log, pids = tmp_path / "runs.log", tmp_path / "pids"
    d = start_daemon(handlers={"types": HOSTILE_TYPES}, pools={"default": {"processes": 1}})
    (child,) = d.children()
    add_task(conn, "spawns-2", "spawns", {"log": str(log), "pids": str(pids), "seconds": 60})
    left = wait_until(lambda: leftover_pids(pids), message="the four leftovers' pids")
    os.kill(child, signal.SIGKILL)
    d.wait_for("worker_exited", child_pid=child)
    wait_until(lambda: not any(pid_alive(p) for p in left), timeout=5,
               message=f"every process the killed child's handler left to die: {left}")
