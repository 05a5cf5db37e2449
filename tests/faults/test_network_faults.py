"""Fault scenarios 4 and 5: the network between one daemon and PostgreSQL fails (the test's
TCP proxy stands in it) while another daemon, connected directly, keeps working.

4. The path stalls past the lease: nothing gets through either way, the sockets stay open.
   The other daemon takes over the stalled daemon's tasks once their leases run out and
   finishes them; the stalled daemon's handlers (cooperative) stop before that by their own
   clock. When the path heals, everything the stalled daemon sent meanwhile reaches the
   server at last (its late final writes among it) and none of it lands: the rows keep the
   other daemon's results. Then every connection is reset at once, and the work goes on.
5. The path is slow (200 ms added to every round trip): fewer tasks per second, but every
   lease is renewed in time, so no task is taken over and none runs twice.
"""

from __future__ import annotations

import time

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from conftest import wait_until
from executions import audit, read_runs
from supervisor import Client
from hosts import why_no_namespaces
from tcpproxy import TcpProxy

pytest_plugins = ["daemon"]


@pytest.fixture
def proxy(db_dsn):
    params = conninfo_to_dict(db_dsn)
    with TcpProxy(params.get("host") or "127.0.0.1", int(params.get("port") or 5432)) as relay:
        yield relay


def through(proxy: TcpProxy, dsn: str) -> str:
    return make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))


def submit(dsn: str, log, ids: list[str], seconds: float) -> None:
    with Client(dsn) as client:
        client.submit_many({"task_type": "works", "task_id": task_id, "max_retries": 20,
                            "payload": {"log": str(log), "seconds": seconds}} for task_id in ids)


def statuses(conn) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall())


@pytest.mark.skipif(why_no_namespaces() is None,
                    reason="tests/faults/test_hosts.py proves this rule with a host of its own "
                           "cut off (network namespaces are allowed here)")
def test_a_daemon_cut_off_past_its_lease_loses_its_tasks_and_none_of_its_late_writes_land(
        start_daemon, conn, db_dsn, proxy, tmp_path):
    lease = 3.0
    log = tmp_path / "runs.log"
    tree = dict(lease={"seconds": lease, "renew_interval": 1}, poll_interval=0.1)
    cut_off = start_daemon("cut-off", dsn=through(proxy, db_dsn),
                           pools={"default": {"processes": 2}}, **tree)
    cut_off.wait_for("worker_booted", count=2)
    ids = ["t0", "t1"]
    submit(db_dsn, log, ids, seconds=6)

    # Both of the cut-off daemon's children hold a task, and have run it a while.
    cut_off.wait_for("task_claimed", count=2, timeout=30)
    held = {e["task_id"]: e["token"] for e in cut_off.find("task_claimed")[:2]}
    wait_until(lambda: {run["task_id"] for run in read_runs(log)} >= set(held),
               message="the cut-off daemon's runs to start")
    # Started only now, so that it is idle when the leases run out: what it takes over, and
    # when, is then the takeover alone.
    direct = start_daemon("direct", pools={"default": {"processes": 2}}, **tree)
    direct.wait_for("worker_booted", count=2)
    stalled_at = time.monotonic()
    proxy.freeze()
    # Work for the direct daemon while the other is cut off.
    busy = [f"s{n}" for n in range(14)]
    submit(db_dsn, log, busy, seconds=0.5)
    ids += busy

    # The direct daemon takes each of them over once its lease ran out, and finishes it.
    for task_id in held:
        direct.wait_for("task_claimed", task_id=task_id, timeout=60)
    taken_after = time.monotonic() - stalled_at
    wait_until(lambda: done(conn, list(held)), timeout=60,
               message="the direct daemon to finish the cut-off daemon's tasks")
    # Let what the cut-off daemon sent meanwhile (its final writes, renewals, retries) reach
    # the server now, late.
    healed = cut_off.mark()
    proxy.thaw()
    for task_id in held:
        cut_off.wait_for("stale_result_discarded", task_id=task_id, timeout=60)
    # The direct daemon may have finished everything meanwhile: new work shows the healed
    # daemon claims and completes again.
    after = [f"u{n}" for n in range(8)]
    submit(db_dsn, log, after, seconds=1)
    cut_off.wait_for("task_completed", since=healed, timeout=60)

    # A reset of every open connection at once, mid-run: the work goes on.
    more = [f"v{n}" for n in range(8)]
    submit(db_dsn, log, more, seconds=0.2)
    proxy.cut()
    more += after
    wait_until(lambda: statuses(conn) == {"COMPLETED": len(ids) + len(more)}, timeout=120,
               message="every task to complete")

    rows = {row[0]: row for row in conn.execute(
        "SELECT id, status, lease_token, claimed_by FROM tasks WHERE id = ANY(%s)",
        (list(held),)).fetchall()}
    for task_id, token in held.items():
        assert rows[task_id][1] == "COMPLETED"
        assert rows[task_id][2] != token, f"{task_id}: the cut-off daemon's late write landed"
    completions = {e["task_id"] for e in direct.find("task_completed")}
    assert set(held) <= completions

    cut_off_pids = cut_off.child_pids
    report = audit(read_runs(log), ids + more, ended_by={},
                   explained=lambda run: run["pid"] in cut_off_pids)
    print(f"\nnetwork stall: {len(ids) + len(more)} tasks, {len(held)} held by the stalled "
          f"daemon, taken over {taken_after:.1f} s after the stall (lease {lease:g} s), "
          f"{report['duplicates']} duplicates, 0 lost")
    assert report["problems"] == [], report["problems"][:10]
    for daemon in (cut_off, direct):
        assert daemon.returncode() is None
        assert not daemon.other_lines, daemon.other_lines[:5]


def test_with_200_ms_added_to_every_round_trip_leases_are_renewed_in_time(
        start_daemon, conn, db_dsn, proxy, tmp_path):
    lease = 3.0
    log = tmp_path / "runs.log"
    tree = dict(lease={"seconds": lease, "renew_interval": 1}, poll_interval=0.1)
    rates = {}
    daemons = []
    for latency in (0.0, 0.2):
        proxy.latency = latency
        daemon = start_daemon(f"latency-{latency:g}", dsn=through(proxy, db_dsn),
                              pools={"default": {"processes": 2}}, **tree)
        daemons.append(daemon)
        daemon.wait_for("worker_booted", count=2)
        short = [f"short-{latency:g}-{n}" for n in range(40)]
        started = time.monotonic()
        submit(db_dsn, log, short, seconds=0.01)
        wait_until(lambda: done(conn, short), timeout=120,
                   message=f"short tasks at {latency:g} s latency")
        rates[latency] = len(short) / (time.monotonic() - started)
        # Tasks that outlive their first lease: each lives on renewals made through the path.
        long = [f"long-{latency:g}-{n}" for n in range(2)]
        submit(db_dsn, log, long, seconds=lease * 1.5)
        wait_until(lambda: done(conn, long), timeout=60,
                   message=f"long tasks at {latency:g} s latency")
        renewed = daemon.find("lease_renewed")
        assert {e["task_id"] for e in renewed} >= set(long), daemon.log_tail()
        for event in ("lease_lost", "lease_renew_failed", "stale_result_discarded",
                      "final_write_retry"):
            assert not daemon.find(event), daemon.log_tail()
        daemon.kill()
    runs = read_runs(log)
    report = audit(runs, sorted({run["task_id"] for run in runs}), ended_by={})
    print(f"\nslow network: {rates[0.0]:.1f} short tasks/s through the proxy, "
          f"{rates[0.2]:.1f} with 200 ms per round trip; leases renewed in time, "
          f"{report['duplicates']} duplicates")
    assert report["problems"] == [] and report["duplicates"] == 0, report
    assert rates[0.2] < rates[0.0]


def done(conn, ids: list[str]) -> bool:
    return conn.execute("SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = "
                        "'COMPLETED'", (ids,)).fetchone()[0] == len(ids)
