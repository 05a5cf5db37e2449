"""Global-limit slot rows written by plain SQL, with a real daemon (issue 15, items 6 and
11): setting a limit rebuilds its slots from the running tasks, so it never makes a second
place for a task that runs; the reaper's repair frees what no live claim holds, so a slot
deleted or held 'infinity' stalls nothing for good. Every execution is recorded outside the
database (tests/handlers/timed_handlers.py)."""

from __future__ import annotations

import signal

from conftest import wait_until
from executions import read_runs
from supervisor import Client
from test_global_limits import most_at_once

pytest_plugins = ["daemon"]


def status(conn, task_id: str) -> str:
    return conn.execute("SELECT status FROM tasks WHERE id = %s", (task_id,)).fetchone()[0]


def test_a_limit_set_after_its_slots_were_deleted_starts_no_second_run(start_daemon, conn,
                                                                      db_dsn, tmp_path):
    """Before: `limit T N` recreated free slots while the first owner ran, and the next task
    of the type started beside it (the owner heard of it only at its next renewal)."""
    log = tmp_path / "runs.log"
    # No reaper pass meanwhile: the setting of the limit alone must rebuild the slots.
    daemon = start_daemon(pools={"default": {"processes": 2, "batch_size": 3}},
                          limits={"works": 1}, lease={"seconds": 8, "renew_interval": 2},
                          reaper={"interval": 120})
    with Client(db_dsn) as client:
        client.submit_many([{"task_type": "works", "task_id": f"t{n}", "priority": 2 - n,
                             "max_retries": 0,
                             "payload": {"log": str(log), "seconds": 3 if n == 0 else 0.2}}
                            for n in range(3)])
        daemon.wait_for("lease_renewed", task_id="t0", timeout=20)
        # Right after a renewal: the next is 2 s away, and the damage is done well before.
        conn.execute("DELETE FROM task_type_slots")
        client.set_limit("works", 1)
        wait_until(lambda: all(status(conn, f"t{n}") != "PENDING" and
                               status(conn, f"t{n}") != "RUNNING" for n in range(3)),
                   timeout=30, message="every task to end")
    runs = read_runs(log)
    assert most_at_once(runs) == 1, runs
    # max_retries 0: the owner kept its lease (its slot was rebuilt held by it), so nothing
    # was lost or charged.
    assert [status(conn, f"t{n}") for n in range(3)] == ["COMPLETED"] * 3
    assert [run["task_id"] for run in runs] == ["t0", "t1", "t2"]
    assert not daemon.find("lease_lost") and not daemon.find("loop_error")


def test_slots_deleted_or_held_forever_are_repaired_by_the_reaper(start_daemon, conn,
                                                                db_dsn, tmp_path):
    """Before: a type whose slots were deleted, or held 'infinity' by a claim that had ended,
    ran nothing ever again, and `limits` showed them running."""
    log = tmp_path / "runs.log"
    daemon = start_daemon(pools={"default": {"processes": 2, "batch_size": 2}},
                          limits={"works": 2})
    with Client(db_dsn) as client:
        def submit(*task_ids: str) -> None:
            client.submit_many([{"task_type": "works", "task_id": task_id, "max_retries": 0,
                                 "payload": {"log": str(log), "seconds": 0.1}}
                                for task_id in task_ids])

        submit("a0", "a1")
        wait_until(lambda: status(conn, "a0") == status(conn, "a1") == "COMPLETED",
                   timeout=20, message="the first tasks to complete")
        # Both slots held forever by the claims that just ended.
        conn.execute("UPDATE task_type_slots AS s SET task_id = t.id, "
                     "lease_token = t.lease_token, lease_until = 'infinity' "
                     "FROM tasks AS t WHERE t.id = 'a' || (s.slot - 1)")
        submit("b0", "b1")
        wait_until(lambda: status(conn, "b0") == status(conn, "b1") == "COMPLETED",
                   timeout=20, message="the tasks behind slots held 'infinity' to run")
        assert daemon.find("limit_slots_repaired")
        conn.execute("DELETE FROM task_type_slots")
        submit("c0", "c1")
        wait_until(lambda: status(conn, "c0") == status(conn, "c1") == "COMPLETED",
                   timeout=20, message="the tasks of a type whose slots were deleted to run")
        (row,) = client.limits()
        assert row["running"] == 0
    assert most_at_once(read_runs(log)) <= 2


def test_a_reload_that_changes_the_limit_and_the_lease_rebuilds_the_slots(start_daemon, conn,
                                                                         db_dsn, tmp_path):
    """The daemon writes its limits at a reload through the same setting: with the slot rows
    deleted while t0 runs, a reload from limit 1 to 2 (and lease 8/2 to 4/1) lets one more
    task run beside t0, not two."""
    log = tmp_path / "runs.log"
    daemon = start_daemon(pools={"default": {"processes": 3, "batch_size": 2}},
                          limits={"works": 1}, lease={"seconds": 8, "renew_interval": 2},
                          reaper={"interval": 120})
    with Client(db_dsn) as client:
        client.submit_many([{"task_type": "works", "task_id": f"t{n}", "priority": 5 - n,
                             "max_retries": 0,
                             "payload": {"log": str(log), "seconds": 4 if n == 0 else 0.5}}
                            for n in range(5)])
    daemon.wait_for("lease_renewed", task_id="t0", timeout=20)
    conn.execute("DELETE FROM task_type_slots")
    mark = daemon.mark()
    daemon.write_config({**daemon.tree, "limits": {"works": 2},
                         "lease": {"seconds": 4, "renew_interval": 1}})
    daemon.send(signal.SIGHUP)
    daemon.wait_for("limit_changed", since=mark, task_type="works", max_running=2)
    wait_until(lambda: conn.execute("SELECT count(*) FROM tasks WHERE status IN "
                                    "('PENDING', 'RUNNING')").fetchone()[0] == 0,
               timeout=40, message="every task to end")
    runs = read_runs(log)
    assert most_at_once(runs) == 2, runs
    assert [status(conn, f"t{n}") for n in range(5)] == ["COMPLETED"] * 5
    assert not daemon.find("lease_lost")
