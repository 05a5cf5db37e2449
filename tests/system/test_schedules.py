"""Periodic tasks on a real daemon: a schedule every second enqueues tasks that run, and a
SIGHUP that removes it stops it; `pgtaskd schedules` reports what the daemon did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta

from conftest import wait_until

pytest_plugins = ["daemon"]

SECOND = timedelta(seconds=1)


def scheduled(conn, name: str) -> list[tuple[str, str, object]]:
    """(id, status, scheduled_time) of a schedule's tasks, oldest instant first."""
    return conn.execute("SELECT id, status, scheduled_time FROM tasks WHERE id LIKE %s "
                        "ORDER BY scheduled_time", (f"schedule:{name}:%",)).fetchall()


def runs_of(conn, name: str) -> dict[str, int]:
    """Task id -> how many times the record handler ran it."""
    return dict(conn.execute("SELECT task_id, count(*) FROM test_runs WHERE task_id LIKE %s "
                             "GROUP BY task_id", (f"schedule:{name}:%",)).fetchall())


def pgtaskd_schedules(config_path, dsn: str, *arguments: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PGTASKD_CONFIG"}
    env["PGTASKD_DSN"] = dsn
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "schedules", "-c",
                           str(config_path), *arguments],
                          capture_output=True, text=True, env=env, timeout=60)


def test_a_schedule_every_second_runs_and_a_reload_without_it_stops_it(start_daemon, conn,
                                                                       db_dsn):
    every_second = {"cron": "* * * * * *", "task_type": "record"}
    # Copies: PyYAML writes a mapping used twice as an anchor and an alias, which the config
    # reader refuses.
    # A type no handler takes: a config warning, logged at start and on each reload (named
    # short, so that the table's columns below keep their widths).
    orphan = {"cron": "0 0 1 1 *", "task_type": "nobody"}
    d = start_daemon(schedules={"tick": dict(every_second), "tock": dict(every_second),
                                "o": dict(orphan)})
    (warned,) = d.find("config_warning")
    assert warned["warning"].startswith("schedules.o.task_type: no handler"), warned

    wait_until(lambda: sum(status == "COMPLETED" for _, status, _ in scheduled(conn, "tick")) >= 3,
               timeout=20, message="three of tick's tasks to run")
    d.wait_for("schedule_enqueued", schedule="tick")
    # One task per second, none skipped, each run once.
    ticks = [at for _, _, at in scheduled(conn, "tick")]
    assert all(b - a == SECOND for a, b in zip(ticks, ticks[1:])), ticks
    assert set(runs_of(conn, "tick").values()) == {1}

    mark = d.mark()
    d.tree["schedules"] = {"tock": dict(every_second), "o": dict(orphan)}
    d.write_config()
    d.send(signal.SIGHUP)
    d.wait_for("reload_finished", since=mark, timeout=30)
    assert len(d.find("config_warning", since=mark)) == 1
    d.wait_for("schedules_applied", since=mark, schedules=["tock", "o"])
    applied = conn.execute("SELECT now()").fetchone()[0]
    # tock goes on: the scheduler made passes after the reload in which tick was gone.
    wait_until(lambda: scheduled(conn, "tock")[-1][2] >= applied + 2 * SECOND, timeout=15,
               message="tock's instants two seconds after the reload")

    ticks = scheduled(conn, "tick")
    # A pass that began before the reload may end with an instant at most a second later.
    assert ticks[-1][2] <= applied + SECOND, (ticks[-1], applied)
    # What was enqueued stays, and runs.
    wait_until(lambda: all(status == "COMPLETED" for _, status, _ in scheduled(conn, "tick")),
               timeout=15, message="tick's last tasks to run")
    assert set(runs_of(conn, "tick")) == {task_id for task_id, _, _ in ticks}

    listed = pgtaskd_schedules(d.config_path, db_dsn, "--json")
    assert listed.returncode == 0, listed.stderr
    tock, = [s for s in json.loads(listed.stdout) if s["name"] == "tock"]
    assert (tock["name"], tock["cron"], tock["timezone"], tock["task_type"]) == (
        "tock", "* * * * * *", "UTC", "record")
    assert tock["last_task_id"].startswith("schedule:tock:")
    assert tock["last_status"] in ("PENDING", "RUNNING", "COMPLETED")
    assert tock["next_run"] > tock["last_run"]

    table = pgtaskd_schedules(d.config_path, db_dsn)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    (row,) = [r for r in rows if r.startswith("tock ")]
    assert header.split() == ["NAME", "CRON", "TIMEZONE", "TYPE", "NEXT", "RUN", "LAST", "RUN",
                              "LAST", "STATUS"]
    assert row.startswith("tock  * * * * * *  UTC       record  ")


def test_daemons_whose_schedule_definitions_disagree_never_mix_them(start_daemon, conn, db_dsn):
    """Two daemons share a schedule name with different payloads (a different type, cron or
    time zone is the same case: each is part of the definition). The first definition
    recorded keeps the schedule: the other daemon enqueues nothing for it and says so, once,
    as does the daemon that sees it; a reload that moves the first daemon to the second's
    definition (one step of a rolling deploy) hands the schedule over without a gap."""
    def tick(by: str) -> dict:
        return {"tick": {"cron": "* * * * * *", "task_type": "record", "payload": {"by": by}}}

    def payloads() -> list[str]:
        return [row[0] for row in conn.execute(
            "SELECT payload->>'by' FROM tasks WHERE id LIKE 'schedule:tick:%' "
            "ORDER BY scheduled_time").fetchall()]

    first = start_daemon("first", schedules=tick("first"))
    first.wait_for("schedule_enqueued", schedule="tick")
    second = start_daemon("second", schedules=tick("second"))
    conflict = second.wait_for("schedule_conflict", schedule="tick")
    assert conflict["enqueues"] is False, conflict
    seen = first.wait_for("schedule_conflict", schedule="tick")
    assert seen["enqueues"] is True, seen
    settled = len(payloads())
    wait_until(lambda: len(payloads()) >= settled + 3, timeout=15,
               message="three more instants while both daemons run")
    assert set(payloads()) == {"first"}, payloads()
    # Once per change, not once per pass.
    assert len(second.find("schedule_conflict")) == 1
    assert len(first.find("schedule_conflict")) == 1

    listed = pgtaskd_schedules(second.config_path, db_dsn, "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["conflict"] is True and row["recorded_definition"] != row["definition"], row
    table = pgtaskd_schedules(second.config_path, db_dsn)
    assert "conflict" in table.stdout, table.stdout

    mark = first.mark()
    first.write_config({**first.tree, "schedules": tick("second")})
    first.send(signal.SIGHUP)
    first.wait_for("schedule_definition_replaced", since=mark, schedule="tick")
    second.wait_for("schedule_conflict_resolved", schedule="tick")
    handed = conn.execute("SELECT now()").fetchone()[0]
    wait_until(lambda: scheduled(conn, "tick")[-1][2] >= handed + 2 * SECOND, timeout=15,
               message="instants after the hand-over")
    after = [p for (_, _, at), p in zip(scheduled(conn, "tick"), payloads()) if at > handed]
    assert set(after) == {"second"}, after
    ticks = [at for _, _, at in scheduled(conn, "tick")]
    # No instant lost or doubled across the hand-over: a reload changes the payload only.
    assert all(b - a == SECOND for a, b in zip(ticks, ticks[1:])), ticks
    listed = json.loads(pgtaskd_schedules(second.config_path, db_dsn, "--json").stdout)
    assert listed[0]["conflict"] is False, listed
