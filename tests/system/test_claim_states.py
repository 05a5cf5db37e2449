"""The supervisor knows each claim's state from its child's messages (issue 14, items 2 and
3): a child that dies charges an attempt only to the claim it was running, the completions it
had not written yet are written, and the claims still waiting in its batch go back free; a
stop gives the waiting claims back at once. Real daemons, real signals, max_retries 0 (where a
wrongly charged attempt shows as FAILED), and every execution recorded outside the database."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from conftest import add_task, task_row, wait_until
from daemon import HANDLER_TYPES, proc_stat
from executions import read_runs

pytestmark = pytest.mark.slow

pytest_plugins = ["daemon"]


def add_batch(conn, log, gate, names: list[tuple[str, str]],
              seconds: dict | None = None) -> None:
    """Tasks in one transaction, so that one claim takes them all, in this order; each runs
    ``seconds[name]`` (default 0)."""
    with conn.transaction():
        for rank, (name, task_type) in enumerate(names):
            add_task(conn, name, task_type,
                     {"log": str(log), "gate": str(gate), "seconds": (seconds or {}).get(name, 0)},
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


def test_a_shrink_gives_the_retired_childs_waiting_claims_back_at_once(start_daemon, conn,
                                                                       tmp_path):
    """SIGTTOU retires the pool's oldest child while the head of its batch runs: its head runs
    on to the end (COMPLETED, no reload_timeout), the three claims waiting behind it go back
    at once, free (max_retries 0), and the other child runs them. Both children hold a batch
    with a gated head, so whichever is the oldest has claims waiting when it is retired."""
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(pools={"default": {"processes": 2, "batch_size": 4}})
    spawned = d.find("worker_spawned", pool="default")
    assert [e["slot"] for e in spawned] == [1, 2], spawned
    oldest = spawned[0]["child_pid"]  # manage_workers shrinks the oldest first
    batches = {"h1": ["a2", "a3", "a4"], "h2": ["b2", "b3", "b4"]}
    add_batch(conn, log, gate, [(name, "gated" if name in batches else "sleeps")
                                for head, waiting in batches.items()
                                for name in [head, *waiting]])
    heads = wait_until(lambda: {r["task_id"]: r["pid"] for r in read_runs(log)
                                if r["task_id"] in batches} if len(read_runs(log)) == 2
                       else None, message="both heads to start, one in each child")
    assert sorted(heads.values()) == sorted(d.children()), heads
    (retired_head,) = [head for head, pid in heads.items() if pid == oldest]
    waiting = batches[retired_head]
    mark = d.mark()
    d.send(signal.SIGTTOU)
    released = d.wait_for("batch_released", since=mark, reason="the worker is stopping",
                          timeout=5)
    assert (released["tasks"], released["released"]) == (3, 3), released
    assert f":{oldest}:" in released["worker_id"], released
    # Given back while the head they waited behind still runs, without spending a retry.
    assert task_row(conn, retired_head)["status"] == "RUNNING"
    for t in waiting:
        row = task_row(conn, t)
        assert (row["status"], row["retry_count"]) == ("PENDING", 0), row
    gate.touch()
    every = [name for head, rest in batches.items() for name in [head, *rest]]
    wait_until(lambda: all(task_row(conn, t)["status"] == "COMPLETED" for t in every),
               timeout=20, message="every task, the retired head too, to complete")
    exited = d.wait_for("worker_exited", since=mark, child_pid=oldest, timeout=10)
    assert exited["stopping"] == "shrink", exited
    runs = {r["task_id"]: r["pid"] for r in read_runs(log)}
    assert len(read_runs(log)) == len(every)  # none ran twice
    assert runs[retired_head] == oldest
    assert all(runs[t] != oldest for t in waiting), runs
    assert [task_row(conn, t)["retry_count"] for t in every] == [0] * len(every)


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


def test_a_claim_that_commits_after_its_child_died_goes_back_free(start_daemon, conn, tmp_path):
    """A child SIGKILLed while its claim statement still runs: the statement goes on in its
    backend and commits after the supervisor looked for the dead child's unheard claims. The
    kill storm on batches found this on a loaded machine (a child killed 70 ms after it booted:
    its batch of 10 FAILED by a reaper 30 s later, none of them run). A trigger holds the
    claim in the database for 2 s, long enough to kill its child meanwhile."""
    lease = 4.0
    log = tmp_path / "runs.log"
    conn.execute("CREATE TABLE slow_claim_once (x int); INSERT INTO slow_claim_once VALUES (1)")
    conn.execute("CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                 " DELETE FROM slow_claim_once; IF FOUND THEN PERFORM pg_sleep(2); END IF;"
                 " RETURN NEW; END $$")
    conn.execute("CREATE TRIGGER slow_claim BEFORE UPDATE OF status ON tasks FOR EACH ROW"
                 " WHEN (OLD.status = 'PENDING' AND NEW.status = 'RUNNING')"
                 " EXECUTE FUNCTION slow_claim()")
    d = start_daemon(lease={"seconds": lease, "renew_interval": 1},
                     pools={"default": {"processes": 1, "batch_size": 3}})
    (pid,) = d.children()
    add_batch(conn, log, tmp_path / "gate", [("c1", "sleeps"), ("c2", "sleeps"), ("c3", "sleeps")])
    wait_until(lambda: conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event = 'PgSleep'").fetchone()[0], message="the claim to be held")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(task_row(conn, t)["status"] == "COMPLETED" for t in ("c1", "c2", "c3")),
               timeout=3 * lease, message="the late claims to go back and run")
    assert [task_row(conn, t)["retry_count"] for t in ("c1", "c2", "c3")] == [0, 0, 0]
    assert sorted(r["task_id"] for r in read_runs(log)) == ["c1", "c2", "c3"]
    (settled,) = d.find("unheard_claims")
    assert settled["tasks"] == 3 and settled["release"] == 3


def test_a_stopped_childs_other_claims_are_settled_long_before_their_lease(start_daemon,
                                                                            conn, tmp_path):
    """A child stopped (SIGSTOP) while a handler of its batch runs: the run it finished before
    (f1) and the four claims waiting behind (w3..w6) would lapse with the stopped run's lease
    and each be charged an attempt (with max_retries 0: FAILED, though f1 succeeded and the
    others never ran). Instead f1 is completed and the four go back free at once, and another
    child runs them, long before their 3 s lease would have lapsed. Let go again, the stopped
    child starts none of them. The handler stops its own child, so the stop lands while the
    four still wait (a batch guard would otherwise give them back itself, and write f1, once
    the handler had run 0.75 s)."""
    lease = 3.0
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    waiting = ["w3", "w4", "w5", "w6"]
    d = start_daemon(lease={"seconds": lease, "renew_interval": 1},
                     pools={"default": {"processes": 1, "batch_size": 6}})
    add_batch(conn, log, gate, [("f1", "sleeps"), ("head", "stops_itself")]
              + [(t, "sleeps") for t in waiting])
    head = wait_until(lambda: [r for r in read_runs(log) if r["task_id"] == "head"],
                      message="the stopping handler to start")[0]
    stopped = head["pid"]
    worker_id = f"{socket.gethostname()}:{stopped}:default#1"
    try:
        wait_until(lambda: proc_stat(stopped)["state"] == "T", message="the child to stop")
        # A second child, started once the whole batch is the stopped one's, to take them.
        d.send(signal.SIGTTIN)
        for t in waiting:
            d.wait_for("task_released", task_id=t, released=True,
                       timeout=lease - 1 - (time.monotonic() - head["start"]))
        settled_after = time.monotonic() - head["start"]
        d.wait_for("task_completed", task_id="f1", written_by="supervisor", timeout=1)
        wait_until(lambda: all(task_row(conn, t)["status"] == "COMPLETED" for t in waiting),
                   timeout=10, message="another child to run the claims given back")
    finally:
        os.kill(stopped, signal.SIGCONT)
    # The resumed child writes the head's outcome only once its batch is behind it.
    wait_until(lambda: d.find("task_completed", task_id="head", worker_id=worker_id)
               or d.find("stale_result_discarded", task_id="head", worker_id=worker_id),
               timeout=10, message="the resumed child to be done with its batch")
    print(f"\nstopped child: its finished run written and its 4 waiting claims given back "
          f"{settled_after:.2f} s after the stop (lease {lease:g} s)")
    for t in ["f1"] + waiting:
        row = task_row(conn, t)
        assert (row["status"], row["retry_count"]) == ("COMPLETED", 0), row
    runs = [(r["task_id"], r["pid"]) for r in read_runs(log) if r["task_id"] != "head"]
    assert sorted(t for t, _ in runs) == ["f1"] + waiting, runs  # each ran once
    assert all(pid != stopped for t, pid in runs if t != "f1"), \
        "the stopped child ran a claim given back"


def test_a_crash_behind_a_timed_head_is_charged_to_the_crasher(start_daemon, conn, tmp_path):
    """A batch: a type with a timeout at its head, done in 0.2 s, then a task that kills its
    own child after 1.5 s, past the head's timeout. The head's timeout ended with its run; the
    crash is the crasher's, and ends it FAILED after its one retry rather than looping."""
    types = {**HANDLER_TYPES, "timed": {"handler": "timed_handlers:sleeps", "timeout": 1}}
    d = start_daemon(handlers={"types": types},
                     pools={"default": {"processes": 1, "batch_size": 2}})
    with conn.transaction():
        add_task(conn, "head", "timed", {"log": str(tmp_path / "runs.log"), "seconds": 0.2},
                 priority=9, max_retries=0)
        add_task(conn, "poison", "suicide_later", {"seconds": 1.5}, priority=1, max_retries=1)
    wait_until(lambda: task_row(conn, "poison")["status"] == "FAILED", timeout=20,
               message="the crasher to end FAILED")
    head, poison = task_row(conn, "head"), task_row(conn, "poison")
    assert (head["status"], head["retry_count"], head["attempts"]) == ("COMPLETED", 0, 1), head
    assert (poison["status"], poison["retry_count"]) == ("FAILED", 1), poison
    (first_charge,) = d.find("task_retry_scheduled", task_id="poison")
    for error in (first_charge["error"], poison["error_message"]):
        assert "died (SIGKILL" in error, error
    assert not d.find("task_timed_out"), "a timeout fired on a run that had ended"
    pids = [pid for (pid,) in conn.execute(
        "SELECT pid FROM test_runs WHERE task_id = 'poison' ORDER BY at").fetchall()]
    assert len(pids) == 2 and pids[0] != pids[1], pids


def test_a_reload_kill_charges_only_the_started_claim_of_a_batch(start_daemon, conn,
                                                                  tmp_path):
    """reload_timeout kills an old child while the head of its batch runs: the head is charged
    (FAILED, max_retries 0), the two claims waiting behind it go back free, to the new
    generation."""
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(reload_timeout=1, pools={"default": {"processes": 1, "batch_size": 3}})
    add_batch(conn, log, gate, [("head", "sleeps"), ("w2", "sleeps"), ("w3", "sleeps")],
              seconds={"head": 30})
    (head,) = wait_until(lambda: read_runs(log), message="the head of the batch to start")
    mark = d.mark()
    d.send(signal.SIGHUP)
    d.wait_for("worker_exited", since=mark, child_pid=head["pid"], timeout=20)
    wait_until(lambda: [task_row(conn, t)["status"] for t in ("head", "w2", "w3")]
               == ["FAILED", "COMPLETED", "COMPLETED"], timeout=20,
               message="the head charged and the waiting claims run by the new generation")
    assert "outlasted reload_timeout (1 s)" in task_row(conn, "head")["error_message"]
    assert [task_row(conn, t)["retry_count"] for t in ("w2", "w3")] == [0, 0]
    runs = [(r["task_id"], r["pid"]) for r in read_runs(log) if r["task_id"] != "head"]
    assert sorted(t for t, _ in runs) == ["w2", "w3"] and head["pid"] not in {p for _, p in runs}
