"""The daemon registry of a real daemon: `pgtaskd daemons --json` shows it with its children
and the task each runs, a reload's new generation, and its sign-off at SIGTERM (real
processes, real signals, real PostgreSQL: tests/daemon.py)."""

from __future__ import annotations

import json
import signal

import pytest

from cli_runs import pgtaskd
from conftest import add_task, wait_until
from daemon_checks import wait_status

pytest_plugins = ["daemon"]

pytestmark = pytest.mark.slow


def registry(dsn: str) -> list[dict]:
    result = pgtaskd("daemons", "--json", dsn=dsn)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_daemons_lists_a_real_daemon_its_tasks_its_reloads_and_its_stop(start_daemon, conn,
                                                                        db_dsn, tmp_path):
    gate, log = tmp_path / "gate", tmp_path / "runs.log"
    d = start_daemon(pools={"default": {"processes": 2, "batch_size": 2}},
                     registry={"interval": 1})
    ids = [add_task(conn, f"g{i}", "gated", {"gate": str(gate), "log": str(log)})
           for i in range(4)]

    def each_child_runs_one():
        # A batch gives its waiting task back once the one ahead ran a second: then each
        # child holds only the task it runs.
        rows = registry(db_dsn)
        children = rows[0]["pools"].get("default", []) if rows else []
        held = [[t["state"] for t in c["tasks"]] for c in children]
        return rows if held == [["running"]] * 2 else None

    [row] = wait_until(each_child_runs_one, 20, message="each child running one task")
    assert (row["pid"], row["state"], row["generation"]) == (d.pid, "running", 1)
    assert row["config_path"] == str(d.config_path.resolve())
    assert row["daemon"].endswith(":" + str(d.config_path.resolve()))
    children = row["pools"]["default"]
    assert {c["pid"] for c in children} == set(d.children())
    assert all((c["state"], c["held"], c["generation"]) == ("working", 1, 1) for c in children)
    for child in children:
        [running] = child["tasks"]
        assert running["type"] == "gated" and running["id"] in ids
        # The task it runs is one it claimed, by the daemon's own log.
        assert d.find("task_claimed", task_id=running["id"])[-1]["pid"] == child["pid"]
    assert len({c["tasks"][0]["id"] for c in children}) == 2

    gate.touch()
    wait_status(conn, ids, "COMPLETED", daemons=[d])
    mark = d.mark()
    d.send(signal.SIGHUP)
    d.wait_for("reload_finished", since=mark, timeout=30)
    new = {e["child_pid"] for e in d.find("worker_spawned", mark, generation=2)}

    def reloaded():
        [now] = registry(db_dsn)
        children = now["pools"]["default"]
        return (now["generation"], now["state"], {c["pid"] for c in children},
                {c["state"] for c in children}) == (2, "running", new, {"idle"})

    wait_until(reloaded, 10, message="generation 2 in the registry, its children idle")

    d.send(signal.SIGTERM)
    assert d.wait_exit(20) == 0
    [stopped] = registry(db_dsn)
    assert (stopped["id"], stopped["state"], stopped["pools"]) == (row["id"], "stopped", {})
