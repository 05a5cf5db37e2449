"""Regression tests for the review findings fixed in d810a2d, on the real daemon.

Real processes, real signals, real PostgreSQL (tests/daemon.py). Each test kills every
process it caused at teardown, grandchildren included, even when it fails.

- a child's process group dies with it: what a handler started is gone before its task can
  run again, after a SIGKILL and after a stop grace ran out (reload, shutdown);
- children stop on their own when the supervisor is killed with SIGKILL;
- an operator's row lock on a dead child's task cannot freeze the arbiter loop;
- a child waiting out a database outage is not killed as stuck at the boot timeout, so the
  outage cannot blow the pool's fuse (slow: the timeout is 60 s; PGTASKD_SLOW_TESTS=1).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import psycopg
import pytest

from conftest import add_task, wait_until
from daemon import HANDLER_TYPES, cmdline, parse_ts, pid_alive
from notify_socket import NotifySocket, longest_gap

from supervisor.daemon.arbiter import BOOT_TIMEOUT
from supervisor.db import store

pytest_plugins = ["daemon"]

SLEEPER_TYPES = {**HANDLER_TYPES, "export": "review_handlers:spawn_sleeper"}


# -- fixtures and helpers -------------------------------------------------------------------


def task_status(conn, task_id: str) -> str | None:
    row = store.task_status(conn, task_id)
    return row["status"] if row else None


@dataclass
class Sleeper:
    attempt: int
    worker_pid: int
    sleeper_pid: int
    alive_before: list[int]


@pytest.fixture
def sleepers(conn):
    """The runs of review_handlers:spawn_sleeper, oldest first; at teardown every sleeper
    still alive is killed (their process groups are the children's, not the daemon's)."""
    conn.execute("CREATE TABLE sleepers (task_id TEXT, attempt INT, worker_pid INT, "
                 "sleeper_pid INT, alive_before INT[], at TIMESTAMPTZ DEFAULT clock_timestamp())")

    def of(task_id: str) -> list[Sleeper]:
        rows = conn.execute("SELECT attempt, worker_pid, sleeper_pid, alive_before FROM sleepers "
                            "WHERE task_id = %s ORDER BY at", (task_id,)).fetchall()
        return [Sleeper(*row) for row in rows]

    yield of
    for (pid,) in conn.execute("SELECT sleeper_pid FROM sleepers").fetchall():
        if pid_alive(pid) and cmdline(pid).startswith("sleep"):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_gone(pid: int, timeout: float, what: str) -> None:
    wait_until(lambda: not pid_alive(pid), timeout=timeout, interval=0.05,
               message=f"{what} (pid {pid}) to be gone from /proc")


# -- 5. a child's process group dies with it ----------------------------------------------------


def test_a_subprocess_of_a_killed_child_dies_before_its_task_runs_again(start_daemon, conn,
                                                                         sleepers):
    # Two children: the other one is idle and claims the rescued task at once.
    d = start_daemon(pools={"default": {"processes": 2}}, handlers={"types": SLEEPER_TYPES})
    add_task(conn, "export-1", "export", {"seconds": 60}, max_retries=3)
    first = wait_until(lambda: sleepers("export-1"), timeout=15,
                       message="the handler to start its subprocess")[0]
    assert pid_alive(first.sleeper_pid)

    mark = d.mark()
    os.kill(first.worker_pid, signal.SIGKILL)  # the OOM killer, say
    d.wait_for("worker_exited", since=mark, child_pid=first.worker_pid)
    runs = wait_until(lambda: len(sleepers("export-1")) >= 2 and sleepers("export-1"),
                      timeout=15, message="the task to run again")
    second = runs[1]

    assert second.worker_pid != first.worker_pid
    assert second.alive_before == [], \
        f"the subprocess of the killed run (pid {first.sleeper_pid}) was still alive when " \
        f"the task ran again in pid {second.worker_pid}"
    wait_gone(first.sleeper_pid, 5, "the killed run's subprocess")
    assert pid_alive(second.sleeper_pid)
    assert d.find("task_retry_scheduled", since=mark, task_id="export-1", rescued=True)


def test_subprocesses_die_with_a_child_killed_when_its_stop_grace_runs_out(start_daemon, conn,
                                                                          sleepers):
    d = start_daemon(pools={"default": {"processes": 1}}, handlers={"types": SLEEPER_TYPES},
                     shutdown_timeout=1, reload_timeout=1)
    add_task(conn, "export-1", "export", {"seconds": 60}, max_retries=3)
    first = wait_until(lambda: sleepers("export-1"), timeout=15,
                       message="the handler to start its subprocess")[0]

    # Reload with a reload_timeout: the old child gets that long to finish, then SIGKILL, and
    # the killed run counts as a failed attempt.
    mark = d.mark()
    d.send(signal.SIGHUP)
    d.wait_for("worker_stop_timeout", since=mark, child_pid=first.worker_pid, timeout=20)
    d.wait_for("task_retry_scheduled", since=mark, task_id="export-1", rescued=True)
    wait_gone(first.sleeper_pid, 5, "the subprocess of the child killed after the reload")
    runs = wait_until(lambda: len(sleepers("export-1")) >= 2 and sleepers("export-1"),
                      timeout=15, message="the task to run again in the new generation")
    second = runs[1]
    assert second.alive_before == [], \
        f"the old generation's subprocess (pid {first.sleeper_pid}) outlived its child"

    # Shutdown: the same once the grace runs out, and the daemon still exits 0.
    mark = d.mark()
    d.send(signal.SIGTERM)
    d.wait_for("worker_stop_timeout", since=mark, child_pid=second.worker_pid, timeout=10)
    assert d.wait_exit(20) == 0
    wait_gone(second.sleeper_pid, 5, "the subprocess of the child killed at shutdown")


# -- 6. orphans -----------------------------------------------------------------------------------


def test_idle_children_stop_on_their_own_when_the_supervisor_is_killed(start_daemon):
    d = start_daemon(pools={"default": {"processes": 2}})
    d.wait_for("worker_booted", count=2)
    children = d.children()
    assert len(children) == 2, children
    mark = d.mark()

    d.process.send_signal(signal.SIGKILL)
    d.process.wait(10)

    for pid in children:
        wait_gone(pid, 10, "a child of the killed supervisor")
    # They stopped the orderly way (SIGTERM from the kernel), not killed by anyone.
    stopped = d.find("worker_stopped", since=mark)
    assert sorted(e["pid"] for e in stopped) == sorted(children), stopped


# -- 8. a row lock held by an operator --------------------------------------------------------


def test_a_row_lock_on_a_dead_childs_task_does_not_freeze_the_supervisor(start_daemon, conn,
                                                                         db_dsn):
    notify = NotifySocket()
    locker = psycopg.connect(db_dsn)  # an operator's psql session
    try:
        d = start_daemon(pools={"default": {"processes": 1}}, env=notify.env)
        add_task(conn, "s1", "slow", {"seconds": 60})
        victim = d.wait_for("task_claimed", task_id="s1")["pid"]
        wait_until(lambda: conn.execute("SELECT count(*) FROM test_runs WHERE task_id = 's1'")
                   .fetchone()[0], message="the handler to start")
        locker.execute("SELECT 1 FROM tasks WHERE id = 's1' FOR UPDATE")

        mark = d.mark()
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        d.wait_for("worker_exited", since=mark, child_pid=victim)
        # The rescue waits on the lock, gives up, and is tried again later; twice, to be sure
        # the loop kept turning in between.
        # (Its error field is the last line of PostgreSQL's message, a CONTEXT line that does
        # not say "lock timeout"; so it is not checked here.)
        d.wait_for("rescue_deferred", since=mark, task_id="s1", count=2, timeout=20)
        gap = longest_gap(notify.pings(), killed, time.monotonic())
        assert gap <= 5.0, f"no watchdog ping for {gap:.1f} s: the arbiter loop was frozen"
        assert task_status(conn, "s1") == "RUNNING"  # still locked: nothing settled it

        # The supervisor still answers signals while the lock is held.
        mark = d.mark()
        sent = time.time()
        d.send(signal.SIGTERM)
        stopping = d.wait_for("supervisor_stopping", since=mark, timeout=5)
        latency = parse_ts(stopping["ts"]) - sent
        assert latency <= 5.0, f"SIGTERM handled {latency:.1f} s after it was sent"
        assert d.wait_exit(20) == 0
        assert d.find("shutdown_unsettled", since=mark)
        gap = longest_gap(notify.pings(), killed, time.monotonic())
        print(f"longest gap between watchdog pings with the lock held: {gap:.2f} s; "
              f"SIGTERM handled after {latency:.2f} s")
    finally:
        locker.close()
        notify.close()


# -- 7. a database outage longer than the boot timeout (slow) ---------------------------------


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("PGTASKD_SLOW_TESTS") != "1",
                    reason=f"runs past the {BOOT_TIMEOUT:g} s boot timeout; "
                           "set PGTASKD_SLOW_TESTS=1")
def test_children_booting_through_an_outage_past_the_boot_timeout_are_not_killed(own_postgres,
                                                                                 start_daemon):
    server = own_postgres
    processes = 5  # the fuse blows at 5 boot failures within a minute
    d = start_daemon(dsn=server.dsn(), pools={"default": {"processes": processes}},
                     database={"connect_timeout": 1})
    d.wait_for("worker_booted", count=processes)
    first = d.children()
    assert len(first) == processes

    # The database goes away, and every child is replaced while it is away: the new ones
    # boot into the outage. (Children that had booted do not count toward the fuse.)
    server.stop("fast")
    mark = d.mark()
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    waiting = wait_until(
        lambda: len(found := d.find("db_unreachable", since=mark)) >= processes and found,
        timeout=30, message="every new child to report that it waits for the database")
    newborn = sorted({e["pid"] for e in waiting})
    assert len(newborn) == processes and not set(newborn) & set(first), (newborn, first)
    spawned = {e["child_pid"]: parse_ts(e["ts"]) for e in d.find("worker_spawned", since=mark)}
    assert set(newborn) <= set(spawned)

    # Well past their boot timeout, they are still there, still waiting; nothing fused.
    watch_until = max(spawned[pid] for pid in newborn) + BOOT_TIMEOUT + 10
    while time.time() < watch_until:
        assert not d.find("pool_fused", since=mark), d.log_tail()
        killed = [e for e in d.find("worker_exited", since=mark) if e["child_pid"] in newborn]
        assert not killed, f"a child waiting for the database was killed: {killed}"
        assert all(pid_alive(pid) for pid in newborn)
        assert d.returncode() is None
        time.sleep(0.5)

    # The database comes back: the same children boot and serve.
    server.start()
    for pid in newborn:
        d.wait_for("worker_booted", since=mark, child_pid=pid, timeout=30)
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        add_task(conn, "after-outage", "echo")
        wait_until(lambda: task_status(conn, "after-outage") == "COMPLETED", timeout=30,
                   message="a task after the outage")
