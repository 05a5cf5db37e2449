"""Global concurrency limits with real daemons: several daemons, each with several children,
never run more tasks of a limited type at once than its limit, by the executions recorded
outside the database; other types run beside it at full width; a daemon killed with -9
holds its slot only until its lease runs out."""

from __future__ import annotations

import signal
import time

from conftest import wait_until
from daemon import HANDLER_TYPES, pid_alive
from executions import most_at_once, read_runs
from supervisor import Client

pytest_plugins = ["daemon"]


def completed(conn, prefix: str) -> int:
    return conn.execute("SELECT count(*) FROM tasks WHERE status = 'COMPLETED' AND id LIKE %s",
                        (prefix + "%",)).fetchone()[0]


def test_three_daemons_of_four_children_never_run_more_than_the_limit(start_daemon, conn,
                                                                     db_dsn, tmp_path):
    limited_log, free_log = tmp_path / "limited.log", tmp_path / "free.log"
    tree = dict(pools={"default": {"processes": 4}}, limits={"sleeps": 2}, poll_interval=0.05)
    daemons = [start_daemon(f"d{n}", **tree) for n in range(3)]
    for daemon in daemons:
        daemon.wait_for("worker_booted", count=4)
    limited, free = 60, 60
    with Client(db_dsn) as client:
        # Both types share the same priorities, so that children go from one type to the
        # other and slots change hands: a full limited type must neither hold the other type
        # back nor be starved by it.
        client.submit_many(
            [{"task_type": "sleeps", "task_id": f"lim{n}", "priority": n % 3,
              "payload": {"log": str(limited_log), "seconds": 0.1}} for n in range(limited)]
            + [{"task_type": "works", "task_id": f"free{n}", "priority": n % 3,
                "payload": {"log": str(free_log), "seconds": 0.3}} for n in range(free)])
    wait_until(lambda: completed(conn, "lim") == limited and completed(conn, "free") == free,
               timeout=120, message="every task to complete")

    limited_runs, free_runs = read_runs(limited_log), read_runs(free_log)
    assert len(limited_runs) == limited and len(free_runs) == free
    at_once = most_at_once(limited_runs)
    holders = len({run["pid"] for run in limited_runs})
    print(f"\nglobal limit 2 over 3 daemons x 4 children: at most {at_once} limited runs at "
          f"once (in {holders} processes), {most_at_once(free_runs)} unlimited")
    assert at_once <= 2
    assert at_once == 2, "the limit was never used in full"
    assert most_at_once(free_runs) > 2, "the unlimited type was held to the limit"
    slots = conn.execute("SELECT count(*) FROM task_type_slots WHERE task_type = 'sleeps' "
                         "AND task_id IS NOT NULL AND lease_until > now()").fetchone()[0]
    assert slots == 0, "a finished task kept its slot"
    for daemon in daemons:
        assert daemon.returncode() is None
        assert not daemon.find("loop_error") and not daemon.find("settle_failed")


def test_a_limit_holds_across_daemons_whose_children_run_twenty_tasks_at_once(start_daemon, conn,
                                                                              db_dsn, tmp_path):
    limited_log, free_log = tmp_path / "limited.log", tmp_path / "free.log"
    tree = dict(pools={"io": {"processes": 1, "concurrency": 20}}, limits={"sleeps_async": 2})
    daemons = [start_daemon(f"d{n}", **tree) for n in range(3)]
    for daemon in daemons:
        daemon.wait_for("worker_booted")
    limited, free = 40, 60
    with Client(db_dsn) as client:
        client.submit_many(
            [{"task_type": "sleeps_async", "task_id": f"lim{n}", "priority": n % 3,
              "payload": {"log": str(limited_log), "seconds": 0.1}} for n in range(limited)]
            + [{"task_type": "sleeps", "task_id": f"free{n}", "priority": n % 3,
                "payload": {"log": str(free_log), "seconds": 0.3}} for n in range(free)])
    wait_until(lambda: completed(conn, "lim") == limited and completed(conn, "free") == free,
               timeout=60, message="every task to complete")
    limited_runs, free_runs = read_runs(limited_log), read_runs(free_log)
    assert len(limited_runs) == limited and len(free_runs) == free
    print(f"\nglobal limit 2 over 3 daemons x concurrency 20: at most "
          f"{most_at_once(limited_runs)} limited runs at once, {most_at_once(free_runs)} "
          "unlimited")
    assert most_at_once(limited_runs) == 2
    assert most_at_once(free_runs) > 20, "the unlimited type was held back"
    for daemon in daemons:
        assert daemon.returncode() is None
        assert not daemon.find("loop_error") and not daemon.find("settle_failed")


def test_a_slot_held_by_a_daemon_killed_with_9_returns_when_its_lease_does(start_daemon, conn,
                                                                          db_dsn, tmp_path):
    log = tmp_path / "runs.log"
    lease = 3.0
    tree = dict(pools={"default": {"processes": 2}}, limits={"sleeps": 1},
                lease={"seconds": lease, "renew_interval": 0.5}, poll_interval=0.1)
    first = start_daemon("first", **tree)
    with Client(db_dsn) as client:
        # t0 runs past the kill and is not retried (the reaper fails it): what the second
        # daemon runs after the kill is t1 and t2, each only once t0's slot came back.
        client.submit_many({"task_type": "sleeps", "task_id": f"t{n}", "priority": int(n == 0),
                            "max_retries": 0 if n == 0 else 5,
                            "payload": {"log": str(log), "seconds": 60 if n == 0 else 0.1}}
                           for n in range(3))
    first.wait_for("task_claimed", task_id="t0")
    wait_until(lambda: read_runs(log), message="the first run to start")

    first.kill()  # -9 to the supervisor and its children: nobody gives the slot back
    killed_at = time.monotonic()
    second = start_daemon("second", **tree)
    wait_until(lambda: len(read_runs(log)) >= 2, timeout=lease + 10,
               message="the slot to come back with the lease")
    runs = read_runs(log)
    waited = runs[1]["start"] - killed_at
    print(f"\nslot of a daemon killed with -9 back after {waited:.1f} s (lease {lease:g} s)")
    # The lease was renewed at most renew_interval before the kill.
    assert waited >= lease - 0.5 - 0.1, runs
    wait_until(lambda: completed(conn, "t") == 2, timeout=30, message="t1 and t2 to complete")
    runs = [dict(run, end=run["end"] if run["end"] is not None else killed_at)
            for run in read_runs(log)]
    assert most_at_once(runs) == 1
    assert second.returncode() is None


def test_a_cancel_that_kills_the_child_gives_the_slot_back_once_the_child_is_dead(
        start_daemon, conn, db_dsn, tmp_path):
    """Issue 14.5: with cancel: kill the cancelled handler never stops by itself, so its slot
    is held until the supervisor has killed its child, and given back when it settles the
    dead child's claims: seconds, not the 30 s lease."""
    log = tmp_path / "runs.log"
    types = {**HANDLER_TYPES, "sleeps": {"handler": "timed_handlers:sleeps", "cancel": "kill"}}
    daemon = start_daemon(pools={"default": {"processes": 2, "batch_size": 2}},
                          handlers={"types": types}, limits={"sleeps": 1},
                          lease={"seconds": 30, "renew_interval": 10}, poll_interval=0.1)
    daemon.wait_for("wakeups_listening")
    with Client(db_dsn) as client:
        client.submit_many({"task_type": "sleeps", "task_id": f"t{n}", "priority": 1 - n,
                            "max_retries": 0,
                            "payload": {"log": str(log), "seconds": 60 if n == 0 else 0.1}}
                           for n in range(2))
        wait_until(lambda: read_runs(log), message="t0 to start")
        cancelled_at = time.monotonic()
        client.cancel("t0")
    wait_until(lambda: completed(conn, "t1") == 1, timeout=10,
               message="t1 to run once t0's child is dead, not when its lease ends")
    daemon.wait_for("task_cancel_killed", task_id="t0")
    first, second = sorted(read_runs(log), key=lambda run: run["start"])
    print(f"\ncancel: kill under a limit of 1: the next task started "
          f"{second['start'] - cancelled_at:.2f} s after the cancel (lease 30 s)")
    assert first["task_id"] == "t0" and first["end"] is None, "t0 was killed, not stopped"
    assert not pid_alive(first["pid"])
    assert conn.execute("SELECT status FROM tasks WHERE id = 't0'").fetchone()[0] == \
        "CANCELLED"


def test_a_reload_writes_changed_limits_and_removes_only_its_own(start_daemon, db_dsn):
    daemon = start_daemon(limits={"sleeps": 2})
    with Client(db_dsn) as client:
        (row,) = client.limits()
        assert (row["task_type"], row["max_running"]) == ("sleeps", 2)
        assert row["updated_by"].startswith("pgtaskd ")
        client.set_limit("works", 5)  # an operator's, not this config's
        mark = daemon.mark()
        daemon.write_config({**daemon.tree, "limits": {"sleeps": 3}})
        daemon.send(signal.SIGHUP)
        changed = daemon.wait_for("limit_changed", since=mark, task_type="sleeps")
        assert (changed["max_running"], changed["previous"]) == (3, 2)
        mark = daemon.mark()
        daemon.write_config({k: v for k, v in daemon.tree.items() if k != "limits"})
        daemon.send(signal.SIGHUP)
        daemon.wait_for("limit_removed", since=mark, task_type="sleeps")
        assert [(r["task_type"], r["max_running"]) for r in client.limits()] == [("works", 5)]


def test_a_limit_several_configs_set_is_each_ones_claim_and_the_smallest_binds(start_daemon,
                                                                              db_dsn):
    """Daemon A and B both set sleeps; A's reload without the line removes only A's claim,
    and while several claims differ the smallest is the limit."""
    def limit() -> list[tuple[str, int]]:
        with Client(db_dsn) as client:
            return [(r["task_type"], r["max_running"]) for r in client.limits()]

    a = start_daemon("a", limits={"sleeps": 2})
    b = start_daemon("b", limits={"sleeps": 2})  # the same write: a no-op before
    assert limit() == [("sleeps", 2)]

    mark = a.mark()
    a.write_config({k: v for k, v in a.tree.items() if k != "limits"})
    a.send(signal.SIGHUP)
    a.wait_for("limits_applied", since=mark)
    assert limit() == [("sleeps", 2)], "B's YAML still sets it"

    mark = a.mark()
    a.write_config({**a.tree, "limits": {"sleeps": 5}})
    a.send(signal.SIGHUP)
    a.wait_for("limits_applied", since=mark)
    assert limit() == [("sleeps", 2)], "the smallest claim binds"

    mark = b.mark()
    b.write_config({k: v for k, v in b.tree.items() if k != "limits"})
    b.send(signal.SIGHUP)
    b.wait_for("limit_changed", since=mark, task_type="sleeps", max_running=5)
    assert limit() == [("sleeps", 5)]

    mark = a.mark()
    a.write_config({k: v for k, v in a.tree.items() if k != "limits"})
    a.send(signal.SIGHUP)
    a.wait_for("limit_removed", since=mark, task_type="sleeps")
    assert limit() == []
