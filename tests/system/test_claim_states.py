"""The supervisor knows each claim's state from its child's messages (issue 14, items 2 and
3): a child that dies charges an attempt only to the claim it was running, the completions it
had not written yet are written, and the claims still waiting in its batch go back free; a
stop gives the waiting claims back at once. Real daemons, real signals, max_retries 0 (where a
wrongly charged attempt shows as FAILED), and every execution recorded outside the database."""

from __future__ import annotations

import os
import signal
import socket

import pytest

from conftest import add_task, task_row, wait_until
from executions import read_runs

pytestmark = pytest.mark.slow

pytest_plugins = ["daemon"]


def add_batch(conn, log, gate, names: list[tuple[str, str]]) -> None:
    """Tasks in one transaction, so that one claim takes them all, in this order."""
    with conn.transaction():
        for rank, (name, task_type) in enumerate(names):
            add_task(conn, name, task_type,
                     {"log": str(log), "gate": str(gate), "seconds": 0},
                     priority=100 - rank, max_retries=0)


def started(log, name: str) -> bool:
    return any(r["task_id"] == name for r in read_runs(log))


def test_a_child_killed_mid_batch_charges_only_the_running_claim(start_daemon, conn, tmp_path):
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(pools={"default": {"processes": 1, "batch_size": 5}})
    (pid,) = d.children()
    add_batch(conn, log, gate, [("f1", "sleeps"), ("f2", "sleeps"), ("s3", "gated"),
                                ("w4", "sleeps"), ("w5", "sleeps")])
    wait_until(lambda: started(log, "s3"), message="the third task of the batch to start")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(task_row(conn, t)["status"] in ("COMPLETED", "FAILED")
                           for t in ("f1", "f2", "s3", "w4", "w5")), timeout=30,
               message="every task of the batch to end")
    ended = {t: task_row(conn, t)["status"] for t in ("f1", "f2", "s3", "w4", "w5")}
    assert ended == {"f1": "COMPLETED", "f2": "COMPLETED", "s3": "FAILED", "w4": "COMPLETED",
                     "w5": "COMPLETED"}
    assert [task_row(conn, t)["retry_count"] for t in ("w4", "w5")] == [0, 0]
    assert "died" in task_row(conn, "s3")["error_message"]
    runs = [r["task_id"] for r in read_runs(log)]
    assert sorted(runs) == ["f1", "f2", "s3", "w4", "w5"], runs  # none ran twice


def test_a_stop_gives_the_waiting_claims_back_at_once(start_daemon, conn, tmp_path):
    """The head of the batch runs on (until shutdown_timeout); the two behind it must not
    wait for it in RUNNING."""
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(shutdown_timeout=20, pools={"default": {"processes": 1, "batch_size": 3}})
    add_batch(conn, log, gate, [("head", "gated"), ("w2", "sleeps"), ("w3", "sleeps")])
    wait_until(lambda: started(log, "head"), message="the head of the batch to start")
    d.send(signal.SIGTERM)
    wait_until(lambda: [task_row(conn, t)["status"] for t in ("head", "w2", "w3")]
               == ["RUNNING", "PENDING", "PENDING"], timeout=5,
               message="the waiting claims to be given back while the head runs")
    assert [task_row(conn, t)["retry_count"] for t in ("w2", "w3")] == [0, 0]
    gate.touch()
    assert d.wait_exit(20) == 0
    assert task_row(conn, "head")["status"] == "COMPLETED"


def test_claims_a_child_died_before_telling_of_go_back_free(start_daemon, conn, tmp_path):
    """A child killed between its claim's commit and its message: the supervisor never heard
    of the claim. The kill storm found whole batches FAILED by the reaper 30 s later without
    having run. Modelled exactly: rows claimed in the child's name by plain SQL, then kill -9.
    A row claimed in its name after its death (another daemon's child with the same pid)
    is not touched."""
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(pools={"default": {"processes": 1, "batch_size": 5}})
    (pid,) = d.children()
    worker_id = f"{socket.gethostname()}:{pid}:default#1"
    payload = {"log": str(log), "gate": str(gate), "seconds": 0}
    with conn.transaction():  # the child never sees them PENDING
        for name in ("u1", "u2", "later"):
            add_task(conn, name, "sleeps", payload, max_retries=0)
        conn.execute(
            "UPDATE tasks SET status = 'RUNNING', claimed_by = %s, attempts = 1,"
            " lease_token = nextval('pgtaskd_lease_token_seq'),"
            " lease_until = now() + interval '60 seconds',"
            " started_at = CASE WHEN id = 'later' THEN now() + interval '1 hour' ELSE now() END"
            " WHERE id IN ('u1', 'u2', 'later')", (worker_id,))
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(task_row(conn, t)["status"] == "COMPLETED" for t in ("u1", "u2")),
               timeout=20, message="the unheard claims to go back and run (lease: 60 s)")
    assert [task_row(conn, t)["retry_count"] for t in ("u1", "u2")] == [0, 0]
    assert sorted(r["task_id"] for r in read_runs(log)) == ["u1", "u2"]
    assert task_row(conn, "later")["status"] == "RUNNING"
    assert task_row(conn, "later")["claimed_by"] == worker_id
