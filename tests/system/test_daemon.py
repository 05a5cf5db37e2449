"""System tests of the daemon (issue 3): real processes, real signals, real PostgreSQL.

Each test starts ``python -m supervisor.cli run`` as a subprocess (tests/daemon.py),
drives it with signals and with rows in a fresh database, and reads what it did from its JSON
log, from /proc and from the tasks table. Every wait has a deadline; every process started
is killed at teardown, even when the test fails (the fixture kills the process group and
every child pid the log announced).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import add_task, billion_laughs, task_row, wait_until
from daemon import HANDLER_TYPES, metric_sum, parse_ts, pid_alive
from daemon_checks import (assert_quiet, count_status, live_by_pool, runs,
                           statuses, wait_healthz, wait_running_title, wait_status)
from pgcluster import free_port


pytest_plugins = ["daemon"]

pytestmark = pytest.mark.slow


# -- crashes ----------------------------------------------------------------------------------


def test_kill9_child_mid_task_is_replaced_and_task_reruns_before_lease(start_daemon, conn):
    lease = 30.0
    d = start_daemon(pools={"default": {"processes": 1}},
                     lease={"seconds": lease, "renew_interval": 10})
    add_task(conn, "k1", "slow_once", {"seconds": 60})
    victim = d.wait_for("task_claimed", task_id="k1", attempt=1)["pid"]
    wait_running_title(victim, "k1")
    wait_until(lambda: runs(conn, "k1"), 10, message="the handler to start (its test_runs row)")

    killed_at = time.time()
    killed_mono = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    again = d.wait_for("task_claimed", task_id="k1", attempt=2, timeout=lease)
    seen_after = time.monotonic() - killed_mono
    rerun_after = parse_ts(again["ts"]) - killed_at
    measure = (f"SIGKILL -> task claimed again: {rerun_after:.3f} s by the log's clock, "
               f"{seen_after:.3f} s seen by the test (lease {lease:g} s)")
    print(measure)
    assert rerun_after < 5.0, measure

    exited = d.wait_for("worker_exited", child_pid=victim)
    assert "SIGKILL" in exited["exit"] and exited["task_id"] == "k1", exited
    d.wait_for("task_retry_scheduled", task_id="k1", rescued=True)
    replacement = again["pid"]
    assert replacement != victim and replacement in d.child_pids
    wait_status(conn, ["k1"], "COMPLETED", daemons=[d])
    row = task_row(conn, "k1")
    assert (row["retry_count"], row["attempts"]) == (1, 2), row
    assert [r["pid"] for r in runs(conn, "k1")] == [victim, replacement]
    assert not pid_alive(victim)
    assert d.children() == [replacement]


def test_handler_that_kills_its_process_every_time_ends_failed(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 1}})
    add_task(conn, "s1", "suicide", max_retries=2)
    wait_status(conn, ["s1"], "FAILED", timeout=30, daemons=[d])

    row = task_row(conn, "s1")
    assert (row["retry_count"], row["attempts"]) == (2, 3), row
    assert "died" in row["error_message"] and "SIGKILL" in row["error_message"], row
    made = runs(conn, "s1")
    assert [r["retry_count"] for r in made] == [0, 1, 2]
    assert len({r["pid"] for r in made}) == 3, "each run was a fresh child"
    deaths = d.find("worker_exited", task_id="s1")
    assert len(deaths) == 3 and all("SIGKILL" in e["exit"] for e in deaths), deaths
    assert len(d.find("task_failed", task_id="s1", rescued=True)) == 1
    assert not d.find("pool_fused"), "children that booted and then died are not a boot loop"
    # The pool is still serving.
    add_task(conn, "after", "echo")
    wait_status(conn, ["after"], "COMPLETED", daemons=[d])
    assert len(d.children()) == 1


def test_broken_handler_import_trips_the_fuse_instead_of_looping(start_daemon, conn):
    port = free_port()
    d = start_daemon(
        handlers={"types": {**HANDLER_TYPES, "broken": "broken_import:handle"}},
        pools={"good": {"processes": 1, "task_types": ["echo"]},
               "bad": {"processes": 1, "task_types": ["broken"]}},
        metrics={"listen": f"127.0.0.1:{port}"}, wait_ready=False)
    fused = d.wait_for("pool_fused", pool="bad", timeout=30)
    assert "cannot import 'broken_import'" in fused["error"], fused
    ready = d.wait_for("supervisor_ready")
    assert ready["fused_pools"] == ["bad"], ready
    bad_spawns = d.find("worker_spawned", pool="bad")
    assert len(bad_spawns) == 5, bad_spawns  # FUSE_FAILURES, then no more
    assert d.find("worker_boot_failed", pool="bad")

    mark = d.mark()
    add_task(conn, "g1", "echo")
    wait_status(conn, ["g1"], "COMPLETED", daemons=[d])
    # Unfused, the next restart would come 1.6-2 s after the fifth failure.
    assert_quiet(d, 3.0, mark, "worker_spawned", pool="bad")
    assert live_by_pool(d) == {"good": 1}
    body = wait_healthz(d, 503, 5)
    assert "bad" in body["failing"]["pools"], body
    # 18.7: the alert PgtaskdPoolFused reads this.
    assert metric_sum(d.metrics(), "pgtaskd_pool_fused", pool="bad") == 1
    assert metric_sum(d.metrics(), "pgtaskd_pool_fused", pool="good") == 0

    # A reload with a fixed config is what re-arms the pool.
    d.tree["handlers"]["types"]["broken"] = "basic:echo"
    d.write_config()
    mark = d.mark()
    d.send(signal.SIGHUP)
    d.wait_for("reload_finished", since=mark, timeout=30)
    wait_until(lambda: live_by_pool(d) == {"good": 1, "bad": 1}, 15,
               message="the bad pool to run again after the fixed reload")
    wait_healthz(d, 200, 10)
    assert "pgtaskd_pool_fused" not in d.metrics(), "re-armed: no pool is fused"
    add_task(conn, "b1", "broken")
    wait_status(conn, ["b1"], "COMPLETED", daemons=[d])


# -- reload -----------------------------------------------------------------------------------


VERSIONED_HANDLER = '''
import os
import time

VERSION = {version!r}


def handle(task):
    time.sleep(float(task.payload.get("seconds", 0)))
    with task.connection() as conn:
        conn.execute("INSERT INTO reload_runs (task_id, version, pid) VALUES (%s, %s, %s)",
                     (task.id, VERSION, os.getpid()))
'''


def test_sighup_reloads_handler_code_and_pool_size_losing_nothing(start_daemon, conn, tmp_path):
    conn.execute("CREATE TABLE reload_runs (task_id TEXT, version TEXT, pid INT)")
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "versioned.py").write_text(VERSIONED_HANDLER.format(version="v1"))
    d = start_daemon(handlers={"path": str(handlers), "types": {"versioned": "versioned:handle"}},
                     pools={"default": {"processes": 2}}, shutdown_timeout=15)
    old = set(d.children())
    assert len(old) == 2

    before = [add_task(conn, f"before-{i}", "versioned") for i in range(4)]
    wait_status(conn, before, "COMPLETED", daemons=[d])
    inflight = [add_task(conn, f"inflight-{i}", "versioned", {"seconds": 1.5}) for i in range(2)]
    for task_id in inflight:
        wait_running_title(d.wait_for("task_claimed", task_id=task_id)["pid"], task_id)

    (handlers / "versioned.py").write_text(VERSIONED_HANDLER.format(version="v2-edited"))
    d.tree["pools"]["default"]["processes"] = 3
    d.write_config()
    mark = d.mark()
    d.send(signal.SIGHUP)
    during = [add_task(conn, f"during-{i}", "versioned") for i in range(6)]
    finished = d.wait_for("reload_finished", since=mark, timeout=30)
    assert finished["pools"] == {"default": 3}
    assert d.find("reload_started", mark)[0]["pools"] == {"default": 3}
    after = [add_task(conn, f"after-{i}", "versioned") for i in range(9)]

    new = {e["child_pid"] for e in d.find("worker_spawned", mark, generation=2)}
    assert len(new) == 3
    wait_until(lambda: set(d.children()) == new, 20,
               message=f"children to be the new generation {new}")
    for pid in old:
        gone = d.wait_for("worker_exited", since=mark, child_pid=pid)
        assert gone["exit"] == "exit code 0" and gone["stopping"] == "reload", gone

    everything = before + inflight + during + after
    wait_status(conn, everything, "COMPLETED", daemons=[d])
    made = conn.execute("SELECT task_id, version, pid FROM reload_runs").fetchall()
    by_task: dict[str, list] = {}
    for task_id, version, pid in made:
        by_task.setdefault(task_id, []).append((version, pid))
    assert {t: len(v) for t, v in by_task.items()} == {t: 1 for t in everything}, \
        "every task ran exactly once"
    assert all(by_task[t][0][0] == "v1" for t in before + inflight)
    assert all(by_task[t][0][0] == "v2-edited" and by_task[t][0][1] in new for t in after), \
        {t: by_task[t] for t in after}
    retried = conn.execute("SELECT count(*) FROM tasks WHERE retry_count > 0 OR attempts <> 1")
    assert retried.fetchone()[0] == 0, "no run was interrupted by the reload"


def test_sighup_with_handler_code_that_fails_to_import_keeps_the_old_generation(start_daemon,
                                                                                 conn, tmp_path):
    conn.execute("CREATE TABLE reload_runs (task_id TEXT, version TEXT, pid INT)")
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "versioned.py").write_text(VERSIONED_HANDLER.format(version="v1"))
    d = start_daemon(handlers={"path": str(handlers), "types": {"versioned": "versioned:handle"}},
                     pools={"default": {"processes": 2}})
    old = d.children()

    (handlers / "versioned.py").write_text("raise ImportError('half-deployed release')\n")
    mark = d.mark()
    d.send(signal.SIGHUP)
    failed = d.wait_for("reload_failed", since=mark, timeout=30)
    assert failed["kept_generation"] == 1 and "before booting" in failed["reason"], failed
    assert d.find("worker_boot_failed", mark)
    assert not d.find("reload_finished", mark)
    wait_until(lambda: d.children() == old, 10, message="only the old generation left")
    task_id = add_task(conn, "kept", "versioned")
    wait_status(conn, [task_id], "COMPLETED", daemons=[d])
    made = conn.execute("SELECT version, pid FROM reload_runs WHERE task_id = 'kept'").fetchall()
    assert len(made) == 1 and made[0][0] == "v1" and made[0][1] in old, made
    assert not d.find("pool_fused")


def test_sighup_with_broken_yaml_changes_nothing(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 2}})
    children = d.children()
    good_yaml = d.config_path.read_text()

    assert "processes: 2" in good_yaml
    for broken, why in (("pools:\n  default: {processes: 5\n", "invalid YAML"),
                        (good_yaml.replace("processes: 2", "processes: -1"),
                         "pools.default.processes: must be from 0 to 512, got -1"),
                        # Refused before anything walks it: the loop (and with it the
                        # watchdog ping) is not held while gigabytes are expanded.
                        (billion_laughs(), "aliases (*name) are not allowed")):
        d.write_raw_config(broken)
        mark = d.mark()
        d.send(signal.SIGHUP)
        failed = d.wait_for("reload_failed", since=mark, timeout=10)
        assert why in " ".join(failed["problems"]), failed
        task_id = add_task(conn, f"still-{mark}", "echo")
        wait_status(conn, [task_id], "COMPLETED", daemons=[d])
        assert d.children() == children
        assert d.find("task_completed", task_id=task_id)[0]["pid"] in children
        for event in ("reload_started", "worker_spawned", "worker_exited"):
            assert not d.find(event, mark), f"{event} after a failed reload"

    # The file on disk is still broken: a child that dies now must come back with the
    # configuration the daemon is running, not fail to boot on the broken file.
    mark = d.mark()
    victim = children[0]
    os.kill(victim, signal.SIGKILL)
    d.wait_for("worker_exited", since=mark, child_pid=victim)
    booted = d.wait_for("worker_booted", since=mark, timeout=15)
    assert not d.find("pool_fused"), d.find("pool_fused")
    wait_until(lambda: len(d.children()) == 2, 10, message="two children again")
    task_id = add_task(conn, "after-restart", "echo")
    wait_status(conn, [task_id], "COMPLETED", daemons=[d])
    assert booted["child_pid"] in d.children()


# -- stopping ---------------------------------------------------------------------------------


def test_sigterm_drains_running_tasks_and_exits_zero(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 2}}, shutdown_timeout=20)
    long = [add_task(conn, f"long-{i}", "slow", {"seconds": 2}) for i in range(2)]
    for task_id in long:
        d.wait_for("task_claimed", task_id=task_id)
    queued = [add_task(conn, f"queued-{i}", "echo") for i in range(4)]

    started = time.monotonic()
    d.send(signal.SIGTERM)
    code = d.wait_exit(timeout=15)
    elapsed = time.monotonic() - started
    assert code == 0, d.log_tail()
    assert elapsed < 10, elapsed

    assert statuses(conn, long) == {t: "COMPLETED" for t in long}
    for task_id in long:
        row = task_row(conn, task_id)
        assert (row["retry_count"], row["attempts"]) == (0, 1), row
    assert statuses(conn, queued) == {t: "PENDING" for t in queued}, "stopped claiming"
    assert all(task_row(conn, t)["attempts"] == 0 for t in queued)
    assert count_status(conn, "RUNNING") == 0
    stopping = d.find("supervisor_stopping")
    assert stopping and stopping[0]["mode"] == "graceful"
    assert d.find("supervisor_stopped")
    assert not d.find("worker_stop_timeout")
    exits = d.find("worker_exited")
    assert len(exits) == 2 and all(e["exit"] == "exit code 0" for e in exits), exits
    assert not [pid for pid in d.child_pids if pid_alive(pid)]


def test_sigterm_kills_a_task_longer_than_shutdown_timeout_and_releases_it(start_daemon, conn):
    timeout = 1.5
    d = start_daemon(pools={"default": {"processes": 1}}, shutdown_timeout=timeout)
    add_task(conn, "t1", "slow", {"seconds": 60}, max_retries=3)
    child = d.wait_for("task_claimed", task_id="t1")["pid"]
    wait_running_title(child, "t1")

    started = time.monotonic()
    d.send(signal.SIGTERM)
    code = d.wait_exit(timeout=timeout + 10)
    elapsed = time.monotonic() - started
    assert code == 0, d.log_tail()
    assert timeout <= elapsed < timeout + 5, elapsed

    stopping = d.find("supervisor_stopping")[0]
    killed = d.find("worker_stop_timeout", task_id="t1")
    assert killed, d.log_tail()
    waited = parse_ts(killed[0]["ts"]) - parse_ts(stopping["ts"])
    assert waited >= timeout - 0.01, f"killed after {waited:.3f} s, before the timeout"
    exited = d.find("worker_exited", child_pid=child)[0]
    assert "SIGKILL" in exited["exit"], exited
    released = d.find("task_released", task_id="t1")
    assert released and released[0]["released"] is True, released
    row = task_row(conn, "t1")
    assert row["status"] == "PENDING" and row["retry_count"] == 0, row
    assert row["claimed_by"] is None and row["lease_until"] is None, row
    assert count_status(conn, "RUNNING") == 0
    assert not pid_alive(child)


def test_sigquit_exits_quickly_and_releases_the_running_task(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 1}}, shutdown_timeout=30)
    add_task(conn, "q1", "slow", {"seconds": 60}, max_retries=3)
    child = d.wait_for("task_claimed", task_id="q1")["pid"]
    wait_running_title(child, "q1")

    started = time.monotonic()
    d.send(signal.SIGQUIT)
    code = d.wait_exit(timeout=10)
    elapsed = time.monotonic() - started
    assert code == 0, d.log_tail()
    assert elapsed < 5, f"quick stop took {elapsed:.2f} s (shutdown_timeout is 30 s)"

    assert d.find("supervisor_stopping")[0]["mode"] == "quick"
    released = d.find("task_released", task_id="q1")
    assert released and released[0]["released"] is True, released
    row = task_row(conn, "q1")
    assert row["status"] == "PENDING" and row["retry_count"] == 0, row
    assert row["claimed_by"] is None and row["lease_until"] is None, row
    assert row["attempts"] == 1, row
    assert not pid_alive(child)


# -- pool size --------------------------------------------------------------------------------


def test_sigttin_and_sigttou_change_each_pool_by_one(start_daemon):
    d = start_daemon(pools={"a": {"processes": 1, "task_types": ["echo"]},
                            "b": {"processes": 2, "task_types": ["echo"]}})
    assert live_by_pool(d) == {"a": 1, "b": 2}
    oldest = {pool: d.find("worker_spawned", pool=pool)[0]["child_pid"] for pool in ("a", "b")}

    mark = d.mark()
    d.send(signal.SIGTTIN)
    assert d.wait_for("pools_resized", since=mark)["targets"] == {"a": 2, "b": 3}
    d.wait_for("worker_booted", since=mark, count=2)
    wait_until(lambda: live_by_pool(d) == {"a": 2, "b": 3}, 10,
               message="a=2, b=3 after SIGTTIN")

    mark = d.mark()
    d.send(signal.SIGTTOU)
    assert d.wait_for("pools_resized", since=mark)["targets"] == {"a": 1, "b": 2}
    wait_until(lambda: live_by_pool(d) == {"a": 1, "b": 2}, 10,
               message="a=1, b=2 after SIGTTOU")
    d.wait_for("worker_exited", since=mark, stopping="shrink", count=2)
    shrunk = d.find("worker_exited", mark, stopping="shrink")
    assert len(shrunk) == 2, shrunk
    # The oldest child of each pool is the one stopped.
    assert {e["pool"]: e["child_pid"] for e in shrunk} == oldest
    assert all(e["exit"] == "exit code 0" for e in shrunk), shrunk

    mark = d.mark()
    d.send(signal.SIGTTOU)
    assert d.wait_for("pools_resized", since=mark)["targets"] == {"a": 0, "b": 1}
    wait_until(lambda: live_by_pool(d) == {"b": 1}, 10, message="a=0, b=1 after SIGTTOU")
    assert not d.find("worker_spawned", mark)


# -- several daemons --------------------------------------------------------------------------


def test_two_daemons_on_one_database_share_the_work_once_each(start_daemon, conn):
    a = start_daemon("a", pools={"default": {"processes": 2}})
    b = start_daemon("b", pools={"default": {"processes": 2}})
    ids = [f"shared-{i:03d}" for i in range(80)]
    with conn.transaction():
        for task_id in ids:
            add_task(conn, task_id, "record", {"sleep": 0.05})
    wait_status(conn, ids, "COMPLETED", timeout=60, daemons=[a, b])

    made = runs(conn)
    per_task: dict[str, int] = {}
    for run in made:
        per_task[run["task_id"]] = per_task.get(run["task_id"], 0) + 1
    assert per_task == {t: 1 for t in ids}, {t: n for t, n in per_task.items() if n != 1}
    by_a = sum(1 for run in made if run["pid"] in a.child_pids)
    by_b = sum(1 for run in made if run["pid"] in b.child_pids)
    print(f"daemon a ran {by_a} tasks, daemon b ran {by_b}")
    assert by_a + by_b == len(ids), "a run by a process neither daemon started"
    assert by_a > 0 and by_b > 0, (by_a, by_b)
    completed = [e["task_id"] for d in (a, b) for e in d.find("task_completed")]
    assert sorted(completed) == ids
    rows = conn.execute("SELECT count(*) FROM tasks WHERE retry_count <> 0 OR attempts <> 1")
    assert rows.fetchone()[0] == 0


