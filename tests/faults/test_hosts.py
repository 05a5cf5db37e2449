"""Fault scenarios 11 to 13: three hosts (network namespaces, tests/hosts.py), a daemon on
each, and a fault on one host's link only, while the others work on.

11. One host's link goes down past its lease, then comes back. The others take its tasks
    over once their leases run out; the completions it sent meanwhile reach PostgreSQL after
    the heal (retransmitted by TCP, or retried by the worker on a new connection) and the
    ownership check refuses them: the rows keep the others' results.
12. One host's link delays what reaches it by 300 ms and drops 10% of it; the others run at
    full speed. Every task completes and no two runs of a task overlap. The slow host's
    long tasks live on renewals sent through the slow link; one whose renewal comes back
    too late is given up by the worker's own clock, so its run stops before it runs again.
13. One host is cut off until the registry calls it lost, while the others take its tasks
    over. When its link comes back it reconnects, shows as running again, and claims and
    completes new work beside the others.

Every execution is recorded outside the database (tests/handlers/timed_handlers.py, on the
machine's monotonic clock, which every namespace shares): afterwards no task is lost, no
two runs of a task overlapped, and a task ran twice only where the cut-off host had run it
first.
"""

from __future__ import annotations

import time

import psycopg

from conftest import wait_until
from daemon import parse_ts
from executions import audit, read_runs
from supervisor import Client

pytest_plugins = ["daemon", "hosts"]

LEASE = 3.0
LONG = LEASE * 1.2  # runs on renewals
TREE = dict(lease={"seconds": LEASE, "renew_interval": 1}, poll_interval=0.1,
            registry={"interval": 1}, pools={"default": {"processes": 2}})


def submit(dsn: str, log, ids: list[str], seconds: float, task_type: str = "works",
           **payload) -> None:
    with Client(dsn) as client:
        client.submit_many({"task_type": task_type, "task_id": task_id, "max_retries": 20,
                            "payload": {"log": str(log), "seconds": seconds, **payload}}
                           for task_id in ids)


def statuses(conn) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall())


def done(conn, ids: list[str]) -> bool:
    return conn.execute("SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = "
                        "'COMPLETED'", (ids,)).fetchone()[0] == len(ids)


def cut_while_running_two_tasks(host_lab, log):
    """Three hosts: the first claims two tasks of 2 s alone (the other two start as it does)
    and is cut off a second into them, just after its first lease renewal. Its runs finish
    while it is cut off, so their completions wait in its TCP stack (or its final-write
    retries) until the heal, while the others take the tasks over once the leases run out
    (a takeover's run takes 0.5 s). Returns the host, its daemon, the others' daemons, what
    it held (task id -> token), and when the cut came (monotonic, wall clock)."""
    cut_off, *others = host_lab.add_hosts(3)
    first = host_lab.start(cut_off, **TREE)
    first.wait_for("worker_booted", count=2)
    submit(host_lab.dsn, log, ["t0", "t1"], seconds=2, retry_seconds=0.5)
    first.wait_for("task_claimed", count=2, timeout=30)
    daemons = [host_lab.start(host, wait_ready=False, **TREE) for host in others]
    held = {e["task_id"]: e["token"] for e in first.find("task_claimed")[:2]}
    for task_id in held:
        first.wait_for("lease_renewed", task_id=task_id)
    began, cut_wall = time.monotonic(), time.time()
    cut_off.cut()
    assert not first.find("task_completed"), "its runs ended before the cut"
    return cut_off, first, daemons, held, (began, cut_wall)


def taken_over(others, task_id: str) -> float | None:
    """When (wall clock: every namespace shares it) another host claimed the task."""
    claims = [parse_ts(e["ts"]) for d in others for e in d.find("task_claimed", task_id=task_id)]
    return min(claims) if claims else None


def test_a_host_cut_off_past_its_lease_loses_its_tasks_and_none_of_its_late_writes_land(
        host_lab, tmp_path):
    log = tmp_path / "runs.log"
    cut_off, first, others, held, (began, cut_wall) = cut_while_running_two_tasks(host_lab,
                                                                                log)
    for daemon in others:
        daemon.wait_for("worker_booted", count=2, timeout=60)
    busy = [f"s{n}" for n in range(10)]
    submit(host_lab.dsn, log, busy, seconds=0.3)

    for task_id in held:
        wait_until(lambda: taken_over(others, task_id), timeout=30,
                   message=f"another host to take {task_id} over")
    taken_after = max(taken_over(others, task_id) for task_id in held) - cut_wall
    cut_for = time.monotonic() - began
    cut_off.heal()
    for task_id in held:
        # Its handler returned: the completion itself reached PostgreSQL, late, and the
        # ownership check refused it.
        first.wait_for("stale_result_discarded", task_id=task_id, result="completed",
                       timeout=60)
    late_after = time.monotonic() - began
    ids = list(held) + busy
    with psycopg.connect(host_lab.dsn, autocommit=True) as conn:
        wait_until(lambda: statuses(conn) == {"COMPLETED": len(ids)}, timeout=60,
                   message="every task to complete")
        rows = dict(conn.execute("SELECT id, lease_token FROM tasks WHERE id = ANY(%s)",
                                 (list(held),)).fetchall())
    for task_id, token in held.items():
        assert rows[task_id] != token, f"{task_id}: the cut-off host's late write landed"
    for task_id in held:  # logged just after the commit
        wait_until(lambda: any(d.find("task_completed", task_id=task_id) for d in others),
                   message=f"another host's task_completed for {task_id}")

    report = audit(read_runs(log), ids, ended_by={},
                   explained=lambda run: run["pid"] in first.child_pids)
    print(f"\nhost cut off: {len(ids)} tasks on 3 hosts, {len(held)} held by the cut-off "
          f"host, taken over {taken_after:.1f} s after the cut (lease {LEASE:g} s), link down "
          f"{cut_for:.1f} s, its late writes refused {late_after:.1f} s after the cut, "
          f"{report['runs']} runs, {report['duplicates']} duplicates, 0 lost")
    assert report["problems"] == [], report["problems"][:10]
    assert report["duplicates"] <= len(held)
    for daemon in [first, *others]:
        assert daemon.returncode() is None
        assert not daemon.other_lines, daemon.other_lines[:5]


def test_one_slow_lossy_host_completes_its_tasks_while_the_others_run_at_full_speed(
        host_lab, tmp_path):
    delay, loss = 0.3, 0.1
    log = tmp_path / "runs.log"
    slow, *fast = host_lab.add_hosts(3)
    how = slow.prepare_slow_path()
    # Tasks of type "long" run on the slow host only, past their lease: they live on
    # renewals made through the slow link. (A claim whose answer took long leaves its first
    # renewal less time to get through: a lease may be lost, and its run stop and run again.)
    long_pool = {"long": {"processes": 2, "task_types": ["long"]},
                 "default": {"processes": 2, "task_types": ["works"]}}
    handlers = {"types": {"works": "timed_handlers:works", "long": "timed_handlers:works"}}
    daemons = [host_lab.start(slow, wait_ready=False, **{**TREE, "pools": long_pool,
                                                         "handlers": handlers})]
    daemons += [host_lab.start(host, wait_ready=False, **{**TREE, "handlers": {
        "types": {"works": "timed_handlers:works"}}}) for host in fast]
    for daemon in daemons:
        daemon.wait_for("worker_booted", count=2, timeout=60)
    # Slowed once booted: a child booting through a slow path is
    # tests/system/test_slow_database_path.py's subject, and would only make this one longer.
    slow.slow_down(delay, loss)
    long = [f"long{n}" for n in range(2)]
    short = [f"t{n}" for n in range(90)]
    started = time.monotonic()
    submit(host_lab.dsn, log, long, seconds=LONG, task_type="long")
    submit(host_lab.dsn, log, short, seconds=0.05)
    with psycopg.connect(host_lab.dsn, autocommit=True) as conn:
        wait_until(lambda: done(conn, short), timeout=120, message="the short tasks")
        drained = time.monotonic() - started
        wait_until(lambda: done(conn, long), timeout=60, message="the long tasks")

    per_host = {d.name: len({e["task_id"] for e in d.find("task_completed")} & set(short))
                for d in daemons}
    slow_daemon = daemons[0]
    renewed = {e["task_id"] for e in slow_daemon.find("lease_renewed")}
    lost = {e["task_id"] for e in slow_daemon.find("lease_lost")}
    runs = read_runs(log)
    slow_pids = slow_daemon.child_pids
    report = audit(runs, long + short, ended_by={},
                   explained=lambda run: run["pid"] in slow_pids and run["task_id"] in lost)
    dropped = slow.packets_dropped()
    print(f"\nslow host ({delay * 1000:g} ms, {loss:.0%} loss by {how}): {len(short)} short "
          f"tasks drained in {drained:.1f} s, "
          f"completed per host {per_host}; {len(long)} tasks of {LONG:g} s on the slow "
          f"host renewed through its link ({len(renewed & set(long))} of them), "
          f"{len(lost)} leases lost there, {report['duplicates']} duplicates"
          + (f", {dropped} packets dropped" if dropped else ""))
    assert report["problems"] == [], report["problems"][:10]
    assert set(long) <= renewed | lost
    slowest_fast = min(per_host[d.name] for d in daemons[1:])
    assert per_host[slow_daemon.name] < slowest_fast, per_host
    for daemon in daemons:
        assert daemon.returncode() is None
        assert not daemon.other_lines, daemon.other_lines[:5]


def test_a_host_back_after_its_tasks_were_taken_over_rejoins_and_claims_again(
        host_lab, tmp_path):
    log = tmp_path / "runs.log"
    cut_off, first, others, held, (began, cut_wall) = cut_while_running_two_tasks(host_lab,
                                                                                log)
    # Cut off until the registry calls it lost (10 s without a heartbeat), with a look at
    # its /healthz from the host itself on the way.
    with Client(host_lab.dsn) as client:
        def state() -> str:
            return next(d["state"] for d in client.daemons() if d["host"] == cut_off.hostname)

        for task_id in held:
            wait_until(lambda: taken_over(others, task_id), timeout=30,
                       message=f"another host to take {task_id} over")
        taken_after = max(taken_over(others, task_id) for task_id in held) - cut_wall
        answers = []  # what /healthz said before it failed

        def unhealthy() -> bool:
            answers.append(cut_off.http_status(first.metrics_port, "/healthz"))
            return answers[-1] == 503

        wait_until(unhealthy, timeout=30, message="the cut-off host's /healthz to fail")
        unhealthy_after = time.monotonic() - began
        wait_until(lambda: state() == "lost", timeout=30, message="the registry to say lost")
        lost_after = time.monotonic() - began
        since = first.mark()
        cut_off.heal()
        healed = time.monotonic()
        wait_until(lambda: state() == "running", timeout=30,
                   message="the registry to say running again")
        back_after = time.monotonic() - healed
    wait_until(lambda: first.http_get("/healthz")[0] == 200, timeout=20,
               message="its /healthz to pass again")
    healthy_after = time.monotonic() - healed
    after = [f"u{n}" for n in range(12)]
    submit(host_lab.dsn, log, after, seconds=0.5)
    first.wait_for("task_completed", since=since, timeout=60)
    claimed_after = time.monotonic() - healed
    ids = list(held) + after
    with psycopg.connect(host_lab.dsn, autocommit=True) as conn:
        wait_until(lambda: statuses(conn) == {"COMPLETED": len(ids)}, timeout=60,
                   message="every task to complete")
    rejoined = {e["task_id"] for e in first.find("task_completed", since=since)} & set(after)
    for task_id in held:
        first.wait_for("stale_result_discarded", task_id=task_id, timeout=60)

    report = audit(read_runs(log), ids, ended_by={},
                   explained=lambda run: run["pid"] in first.child_pids)
    print(f"\nhost back: cut off {healed - began:.1f} s; its tasks taken over "
          f"{taken_after:.1f} s after the cut, its /healthz (asked from the host) "
          f"{sorted(set(answers[:-1]))} then 503 after "
          f"{unhealthy_after:.1f} s, lost in the registry after {lost_after:.1f} s; after the "
          f"heal: running in the registry again after {back_after:.1f} s, /healthz 200 after "
          f"{healthy_after:.1f} s, a new task completed after {claimed_after:.1f} s "
          f"({len(rejoined)} of {len(after)} new tasks); {report['duplicates']} duplicates, "
          f"0 lost")
    assert report["problems"] == [], report["problems"][:10]
    assert rejoined
    for daemon in [first, *others]:
        assert daemon.returncode() is None
        assert not daemon.other_lines, daemon.other_lines[:5]
