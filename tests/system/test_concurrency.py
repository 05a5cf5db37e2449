"""Many tasks at once in one child (pools.<name>.concurrency, issue 16): plain handlers on
threads, async ones on an event loop, each claim with its own lease and state. Real daemons,
real signals, every execution recorded outside the database."""

from __future__ import annotations

import os
import signal
import time

import pytest

from supervisor import Client

from conftest import add_task, task_row, wait_until
from executions import most_at_once, overlaps, read_runs

pytestmark = pytest.mark.slow

pytest_plugins = ["daemon"]


def statuses(conn, names) -> dict[str, str]:
    return {name: task_row(conn, name)["status"] for name in names}


def test_one_child_runs_threads_and_async_handlers_side_by_side(start_daemon, conn, tmp_path):
    log = tmp_path / "runs.log"
    d = start_daemon(pools={"io": {"processes": 1, "concurrency": 12}})
    names = [f"t{i}" for i in range(6)] + [f"a{i}" for i in range(6)]
    with conn.transaction():
        for name in names:
            add_task(conn, name, "sleeps" if name[0] == "t" else "sleeps_async",
                     {"log": str(log), "seconds": 1.5})
    wait_until(lambda: set(statuses(conn, names).values()) == {"COMPLETED"}, timeout=20,
               message="every task to complete")
    runs = read_runs(log)
    assert sorted(r["task_id"] for r in runs) == sorted(names), runs  # each ran once
    assert len({r["pid"] for r in runs}) == 1
    # All twelve in one child at once: 1.5 s each, run one after another, would take 18 s.
    assert most_at_once(runs) == 12, runs
    rows = {name: task_row(conn, name) for name in names}
    # A thread's CPU is its own; an async run's interleaves with the others', so none.
    assert all(rows[n]["cpu_seconds"] is not None for n in names if n[0] == "t"), rows
    assert all(rows[n]["cpu_seconds"] is None for n in names if n[0] == "a"), rows
    assert not d.find("loop_error") and not d.find("settle_failed")


def test_a_handlers_own_log_lines_name_its_task_among_many_at_once(start_daemon, conn):
    d = start_daemon(pools={"io": {"processes": 1, "concurrency": 10}})
    names = [f"c{i}" for i in range(10)]
    with conn.transaction():
        for i, name in enumerate(names):
            add_task(conn, name, "chatty_async" if i % 2 else "chatty", {"seconds": 0.5})
    wait_until(lambda: set(statuses(conn, names).values()) == {"COMPLETED"}, timeout=20,
               message="every task to complete")
    d.refresh()
    lines = [e for e in d.events if e.get("logger") == "app"]
    assert len(lines) == 20, lines
    for line in lines:
        assert line["message"].split()[1] == line["task_id"], line
        assert line["task_type"] == ("chatty_async" if int(line["task_id"][1:]) % 2
                                     else "chatty"), line


def test_a_concurrent_child_never_holds_more_than_its_room(start_daemon, conn, tmp_path):
    log = tmp_path / "runs.log"
    start_daemon(pools={"io": {"processes": 1, "concurrency": 3}})
    names = [f"s{i}" for i in range(9)]
    with conn.transaction():
        for name in names:
            add_task(conn, name, "sleeps_async", {"log": str(log), "seconds": 0.5})
    wait_until(lambda: sum(s == "RUNNING" for s in statuses(conn, names).values()) == 3,
               message="three tasks to run")
    assert sum(s == "RUNNING" for s in statuses(conn, names).values()) == 3
    wait_until(lambda: set(statuses(conn, names).values()) == {"COMPLETED"}, timeout=20,
               message="every task to complete")
    runs = read_runs(log)
    assert most_at_once(runs) == 3, runs
    assert not overlaps(runs)


def test_a_killed_concurrent_child_charges_exactly_the_tasks_it_was_running(
        start_daemon, conn, tmp_path):
    """max_retries 0: an attempt charged to a task that was not running shows as FAILED."""
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(pools={"io": {"processes": 1, "concurrency": 4}})
    (pid,) = d.children()
    running = [f"g{i}" for i in range(4)]
    queued = [f"q{i}" for i in range(3)]
    with conn.transaction():
        for rank, name in enumerate(running + queued):
            add_task(conn, name, "gated" if name[0] == "g" else "sleeps",
                     {"log": str(log), "gate": str(gate), "seconds": 0},
                     priority=100 - rank, max_retries=0)
    wait_until(lambda: {r["task_id"] for r in read_runs(log)} == set(running),
               message="the four gated tasks to start")
    assert statuses(conn, queued) == dict.fromkeys(queued, "PENDING")  # no room for them
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: set(statuses(conn, running + queued).values()) <= {"FAILED", "COMPLETED"},
               timeout=30, message="every task to end")
    assert statuses(conn, running) == dict.fromkeys(running, "FAILED")
    assert all("died" in task_row(conn, n)["error_message"] for n in running)
    assert statuses(conn, queued) == dict.fromkeys(queued, "COMPLETED")
    assert [task_row(conn, n)["retry_count"] for n in queued] == [0, 0, 0]
    assert sorted(r["task_id"] for r in read_runs(log)) == sorted(running + queued)


def test_a_stop_lets_every_running_task_finish_and_a_cancel_reaches_its_own(
        start_daemon, conn, tmp_path):
    log = tmp_path / "runs.log"
    d = start_daemon(shutdown_timeout=20, pools={"io": {"processes": 1, "concurrency": 4}})
    names = ["w0", "w1", "w2", "w3"]
    with conn.transaction():
        for name in names:
            add_task(conn, name, "works_async" if name in ("w0", "w1") else "works",
                     {"log": str(log), "seconds": 3}, max_retries=0)
    wait_until(lambda: len(read_runs(log)) == 4, message="four runs to start")
    Client(d.dsn).cancel("w0")
    wait_until(lambda: task_row(conn, "w0")["status"] == "CANCELLED", timeout=5,
               message="the cancel to stop the async run")
    assert all(r["end"] is None for r in read_runs(log) if r["task_id"] != "w0")
    d.send(signal.SIGTERM)
    assert d.wait_exit(20) == 0
    assert statuses(conn, names[1:]) == dict.fromkeys(names[1:], "COMPLETED")
    assert sorted(r["task_id"] for r in read_runs(log)) == names  # none ran twice


def test_a_recycling_concurrent_child_stops_claiming_and_lets_its_running_tasks_finish(
        start_daemon, conn, tmp_path):
    """Recycling counts the tasks of every thread: 2 quick ones end the child's run of 2
    while 2 others still run. The child claims no more, its running tasks finish in it, and
    the fresh child runs the rest. max_retries 0: a task given back as charged, or cut off,
    would show as FAILED."""
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(pools={"io": {"processes": 1, "concurrency": 4,
                                     "max_tasks_per_child": 2}})
    (first,) = d.children()
    gated, quick, queued = ["g0", "g1"], ["k0", "k1"], ["q0", "q1", "q2"]
    with conn.transaction():
        for rank, name in enumerate(gated + quick + queued):
            add_task(conn, name, "gated" if name[0] == "g" else "sleeps",
                     {"log": str(log), "gate": str(gate), "seconds": 0},
                     priority=100 - rank, max_retries=0)
    wait_until(lambda: d.find("worker_recycling"), message="the child to decide to recycle")
    assert {r["task_id"] for r in read_runs(log)} >= set(gated)
    # It holds its running tasks and claims nothing more until they end.
    assert statuses(conn, gated) == dict.fromkeys(gated, "RUNNING")
    assert first in d.children()
    gate.touch()
    names = gated + quick + queued
    wait_until(lambda: set(statuses(conn, names).values()) == {"COMPLETED"}, timeout=30,
               message="every task to complete")
    runs = read_runs(log)
    assert sorted(r["task_id"] for r in runs) == sorted(names)  # each once
    assert {r["pid"] for r in runs if r["task_id"] in gated} == {first}
    events = d.events
    decided = next(i for i, e in enumerate(events) if e["event"] == "worker_recycling")
    assert not [e for e in events[decided:] if e["event"] == "task_claimed" and e["pid"] == first]
    assert any(r["pid"] != first for r in runs)  # the fresh child ran what was left
    assert not overlaps(runs)
    exited = [e for e in d.find("worker_exited") if e["child_pid"] == first]
    assert exited and exited[0]["stopping"] == "recycle" and exited[0]["exit"] == "exit code 0"


def test_a_memory_limit_below_a_fresh_childs_size_recycles_after_a_task_not_at_boot(
        start_daemon, conn, tmp_path):
    """max_memory_mb 1 is below any Python child: it used to be replaced the moment it booted,
    four times a second, and the daemon never became ready."""
    log = tmp_path / "runs.log"
    d = start_daemon(pools={"io": {"processes": 1, "concurrency": 4, "max_memory_mb": 1}})
    (first,) = d.children()
    add_task(conn, "t0", "sleeps", {"log": str(log), "seconds": 0}, max_retries=0)
    wait_until(lambda: task_row(conn, "t0")["status"] == "COMPLETED", message="t0 to complete")
    recycled = d.wait_for("worker_recycling", pid=first)
    assert "max_memory_mb" in recycled["reason"]
    assert len(d.find("worker_spawned")) <= 2


# (gated type, quick type) of each runner kind: threads, or one event loop.
RUNNERS = {"threads": ("gated", "sleeps"), "async": ("gated_async", "sleeps_async")}


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_a_pause_stops_new_runs_of_its_type_in_a_full_concurrent_child(start_daemon, conn,
                                                                       tmp_path, runner):
    """Issue 16.5: paused while 8 of its tasks run in one child and 4 more wait. The 8 finish
    COMPLETED; from then on the child has room, and its claims take another type's tasks
    but none of the paused type, though those are due and rank ahead (a claim that missed
    the pause would have taken them first). Resumed, they run, each once."""
    gated, quick = RUNNERS[runner]
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(pools={"io": {"processes": 1, "concurrency": 8}})
    running = [f"p{i}" for i in range(8)]
    waiting = [f"w{i}" for i in range(4)]
    others = [f"o{i}" for i in range(4)]
    payload = {"log": str(log), "gate": str(gate), "seconds": 0}
    with conn.transaction():
        for rank, name in enumerate(running + waiting):
            add_task(conn, name, gated, payload, priority=100 - rank)
    wait_until(lambda: {r["task_id"] for r in read_runs(log)} == set(running),
               message="eight runs to start")
    assert statuses(conn, waiting) == dict.fromkeys(waiting, "PENDING")  # no room for them
    with Client(d.dsn) as client:
        # The child is full: no claim of it is under way while the pause commits.
        assert client.pause(gated)
        paused_at = time.monotonic()
        with conn.transaction():
            for name in others:
                add_task(conn, name, quick, payload, priority=0)
        gate.touch()
        wait_until(lambda: set(statuses(conn, running + others).values()) == {"COMPLETED"},
                   timeout=20, message="the running tasks and the other type's to complete")
        assert [(task_row(conn, n)["status"], task_row(conn, n)["attempts"])
                for n in waiting] == [("PENDING", 0)] * len(waiting)
        started_since = {r["task_id"] for r in read_runs(log) if r["start"] > paused_at}
        assert started_since == set(others), started_since
        assert client.resume(gated)
    wait_until(lambda: set(statuses(conn, waiting).values()) == {"COMPLETED"}, timeout=10,
               message="the paused type's waiting tasks to run once resumed")
    runs = read_runs(log)
    assert sorted(r["task_id"] for r in runs) == sorted(running + waiting + others)  # each once
    assert len({r["pid"] for r in runs}) == 1
    assert not d.find("loop_error") and not d.find("settle_failed")


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_a_unique_key_holds_while_its_task_runs_in_a_concurrent_child(start_daemon, conn,
                                                                      tmp_path, runner):
    """Issue 16.5: while the task holding key K runs in a child with room for 8, submitting
    K again creates nothing (the holder's id, created False) though the child goes on
    claiming other tasks; once it completed, K is free and a new task takes it. The two runs
    with K never overlap."""
    gated, quick = RUNNERS[runner]
    log, gate = tmp_path / "runs.log", tmp_path / "gate"
    d = start_daemon(pools={"io": {"processes": 1, "concurrency": 8}})
    payload = {"log": str(log), "gate": str(gate), "seconds": 0}
    with Client(d.dsn) as client:
        first = client.submit(gated, payload, unique_key="K")
        assert first.created
        wait_until(lambda: read_runs(log), message="the task holding K to start")
        again = [client.submit(quick, payload, unique_key="K") for _ in range(3)]
        assert [(str(s), s.created) for s in again] == [(str(first), False)] * 3
        # The child has room and claims: tasks without the key run meanwhile.
        free = [client.submit(quick, payload) for _ in range(3)]
        wait_until(lambda: set(statuses(conn, free).values()) == {"COMPLETED"},
                   message="tasks without the key to run beside it")
        assert task_row(conn, str(first))["status"] == "RUNNING"
        keyed = conn.execute("SELECT count(*) FROM tasks WHERE unique_key = 'K'").fetchone()
        assert keyed == (1,)
        gate.touch()
        wait_until(lambda: task_row(conn, str(first))["status"] == "COMPLETED",
                   message="the task holding K to complete")
        second = client.submit(quick, payload, unique_key="K")
        assert second.created and str(second) != str(first)
    wait_until(lambda: task_row(conn, str(second))["status"] == "COMPLETED",
               message="the new task with K to complete")
    keyed = sorted((r for r in read_runs(log) if r["task_id"] in (str(first), str(second))),
                   key=lambda r: r["start"])
    assert [r["task_id"] for r in keyed] == [str(first), str(second)], keyed
    assert keyed[0]["end"] <= keyed[1]["start"], keyed
    assert not d.find("loop_error")
