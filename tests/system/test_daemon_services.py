"""System tests of the daemon's services: metrics, /healthz, the lease reaper, retention and
process titles; real processes, real signals, real PostgreSQL (tests/daemon.py)."""

from __future__ import annotations

import signal

import psycopg
import pytest

from conftest import add_task, task_row, wait_until
from daemon import cmdline, metric_sum, pid_alive
from daemon_checks import FINAL, wait_healthz, wait_running_title, wait_status
from pgcluster import free_port
from supervisor import __version__


pytest_plugins = ["daemon"]

pytestmark = pytest.mark.slow


# -- metrics and health -----------------------------------------------------------------------


def test_metrics_counters_equal_the_database_children_that_exited_included(start_daemon, conn):
    port = free_port()
    d = start_daemon(pools={"default": {"processes": 2}}, metrics={"listen": f"127.0.0.1:{port}"})
    ids = [add_task(conn, f"ok-{i}", "echo") for i in range(12)]
    ids += [add_task(conn, f"fail-{i}", "fail", max_retries=1) for i in range(3)]
    ids += [add_task(conn, f"perm-{i}", "permanent", max_retries=3) for i in range(2)]
    ids += [add_task(conn, "die", "suicide", max_retries=1)]
    wait_status(conn, ids, FINAL, timeout=30, daemons=[d])

    # Replace every child that did the work: their counters must still count.
    d.wait_for("worker_booted", count=4)  # the first two, and the two that replaced the deaths
    mark = d.mark()
    workers = set(d.child_pids)
    d.send(signal.SIGHUP)
    d.wait_for("reload_finished", since=mark, timeout=30)
    for pid in workers:
        d.wait_for("worker_exited", child_pid=pid)
    assert not [pid for pid in workers if pid_alive(pid)], "a child that ran tasks still lives"
    assert not workers & set(d.children())
    assert len(workers) >= 4, workers  # two deaths by SIGKILL and two replacements at least
    claimed_by = {e["pid"] for e in d.find("task_claimed")}
    assert claimed_by <= workers, "only the replaced children ran tasks"

    db = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'COMPLETED'), "
        "       count(*) FILTER (WHERE status = 'FAILED'), "
        "       sum(attempts), sum(retry_count) FROM tasks").fetchone()
    completed, failed, attempts, retries = (int(v) for v in db)
    assert (completed, failed) == (12, 6)
    by_status = dict(conn.execute("SELECT status, count(*) FROM tasks GROUP BY status").fetchall())

    def gauges_current():
        samples = d.metrics()
        return all(metric_sum(samples, "pgtaskd_tasks", status=s) == by_status.get(s, 0)
                   for s in ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"))

    wait_until(gauges_current, 10, message="the queue gauges to catch up with the table")
    samples = d.metrics()
    seen = {name: metric_sum(samples, f"pgtaskd_{name}_total") for name in
            ("tasks_claimed", "tasks_completed", "tasks_failed", "tasks_retried",
             "tasks_rescued", "worker_restarts")}
    expected = {"tasks_claimed": attempts, "tasks_completed": completed,
                "tasks_failed": failed, "tasks_retried": retries,
                "tasks_rescued": 2}  # the suicide's two runs, settled by the supervisor
    assert {k: seen[k] for k in expected} == expected, (seen, expected)
    assert seen["worker_restarts"] >= 2, seen
    assert metric_sum(samples, "pgtaskd_build_info", version=__version__) == 1
    assert d.find("supervisor_starting")[0]["version"] == __version__
    assert metric_sum(samples, "pgtaskd_tasks_completed_total", task_type="echo") == 12
    assert metric_sum(samples, "pgtaskd_tasks_failed_total", task_type="fail") == 3
    assert metric_sum(samples, "pgtaskd_tasks_failed_total", task_type="permanent") == 2
    assert metric_sum(samples, "pgtaskd_tasks_failed_total", task_type="suicide") == 1
    assert metric_sum(samples, "pgtaskd_live_children") == 2
    estimated = samples.get("pgtaskd_tasks_estimated", [])
    assert {labels["status"] for labels, _ in estimated} == set(by_status) | {"PENDING", "RUNNING",
                                                                             "CANCELLED"}
    assert metric_sum(samples, "pgtaskd_tasks_estimated") == 0, "a small table is counted"
    # 18.6: by type, the handled ones each, every other under _other.
    assert metric_sum(samples, "pgtaskd_tasks", status="COMPLETED", task_type="") == 12
    assert {labels["task_type"] for labels, _ in samples["pgtaskd_oldest_pending_age_seconds"]} \
        >= {"echo", "fail", "suicide", "_other"}


def test_healthz_is_503_while_the_database_is_down_and_200_when_it_is_back(own_postgres,
                                                                           start_daemon):
    server = own_postgres
    port = free_port()
    d = start_daemon(dsn=server.dsn(), pools={"default": {"processes": 1}},
                     metrics={"listen": f"127.0.0.1:{port}"}, database={"connect_timeout": 1})
    wait_healthz(d, 200, 10)

    server.stop("fast")
    body = wait_healthz(d, 503, 15)
    assert body["checks"]["database"]["ok"] is False, body
    assert "database" in body["failing"], body
    assert metric_sum(d.metrics(), "pgtaskd_database_up") == 0

    server.start()
    body = wait_healthz(d, 200, 30)
    assert body["checks"]["database"]["ok"] is True and body["failing"] == {}, body
    assert metric_sum(d.metrics(), "pgtaskd_database_up") == 1
    # The children came through the outage and serve again.
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        add_task(conn, "after-outage", "echo")
        wait_status(conn, ["after-outage"], "COMPLETED", timeout=30, daemons=[d])
    assert d.returncode() is None


# -- the lease reaper -------------------------------------------------------------------------


def _expired_running(conn, task_id: str, *, retry_count: int, max_retries: int,
                     owner: str = "ghost-host:4242:default#1", token: int = 424242) -> None:
    """A task whose owner is gone: RUNNING, a fake claimed_by and lease_token, lease passed.
    Its type is one no pool runs, so only the reaper (not a claim) can take it back."""
    add_task(conn, task_id, "orphan", max_retries=max_retries)
    changed = conn.execute(
        "UPDATE tasks SET status = 'RUNNING', claimed_by = %s, lease_token = %s, "
        "retry_count = %s, attempts = retry_count + 1, started_at = now() - interval '1 minute', "
        "lease_until = now() - interval '1 second' WHERE id = %s AND status = 'PENDING'",
        (owner, token, retry_count, task_id)).rowcount
    assert changed == 1


def test_lease_reaper_requeues_or_fails_expired_leases_and_leaves_cancelled_alone(start_daemon,
                                                                                   conn):
    port = free_port()
    d = start_daemon(pools={"default": {"processes": 1}}, metrics={"listen": f"127.0.0.1:{port}"})
    # A cancelled row that still carries an owner and a lease in the past, and a RUNNING row
    # whose lease is still valid: the reaper must touch neither.
    add_task(conn, "r-cancelled", "orphan")
    conn.execute("UPDATE tasks SET status = 'CANCELLED', claimed_by = 'ghost-host:1:x#1', "
                 "lease_token = 7, lease_until = now() - interval '1 hour', "
                 "finished_at = now() WHERE id = 'r-cancelled'")
    add_task(conn, "r-live", "orphan")
    conn.execute("UPDATE tasks SET status = 'RUNNING', claimed_by = 'ghost-host:2:x#1', "
                 "lease_token = 8, lease_until = now() + interval '1 hour' WHERE id = 'r-live'")
    untouched = {t: task_row(conn, t) for t in ("r-cancelled", "r-live")}

    mark = d.mark()
    _expired_running(conn, "r-requeue", retry_count=1, max_retries=3)
    _expired_running(conn, "r-fail", retry_count=2, max_retries=2)
    requeued = d.wait_for("lease_expired_task_requeued", since=mark, task_id="r-requeue",
                          timeout=10)
    failed = d.wait_for("lease_expired_task_failed", since=mark, task_id="r-fail", timeout=10)
    assert requeued["retry_count"] == 2 and failed["retry_count"] == 2

    row = task_row(conn, "r-requeue")
    assert row["status"] == "PENDING" and row["retry_count"] == 2, row
    assert row["claimed_by"] is None and row["lease_until"] is None, row
    assert "ghost-host:4242" in row["error_message"] and "expired" in row["error_message"], row
    row = task_row(conn, "r-fail")
    assert row["status"] == "FAILED" and row["retry_count"] == 2, row
    assert row["finished_at"] is not None and row["claimed_by"] is None, row

    # One more expired row, reaped by a later pass, proves the reaper kept running over them.
    _expired_running(conn, "r-sentinel", retry_count=0, max_retries=1)
    d.wait_for("lease_expired_task_requeued", since=mark, task_id="r-sentinel", timeout=10)
    for task_id, before in untouched.items():
        assert task_row(conn, task_id) == before, f"the reaper touched {task_id}"
    assert len(d.find("lease_expired_task_requeued", mark)) == 2
    assert len(d.find("lease_expired_task_failed", mark)) == 1

    samples = d.metrics()
    assert metric_sum(samples, "pgtaskd_leases_reaped_total", status="PENDING") == 2
    assert metric_sum(samples, "pgtaskd_leases_reaped_total", status="FAILED") == 1


# -- retention ------------------------------------------------------------------------------


def _finished(conn, task_id: str, status: str, age_seconds: float) -> None:
    """A task of a type no pool runs that reached ``status`` this long ago (database clock)."""
    add_task(conn, task_id, "orphan")
    conn.execute("UPDATE tasks SET status = %s, finished_at = now() - %s * interval '1 second' "
                 "WHERE id = %s", (status, age_seconds, task_id))


def _present(conn, ids) -> set[str]:
    return {row[0] for row in conn.execute("SELECT id FROM tasks WHERE id = ANY(%s)",
                                           (list(ids),))}


def test_retention_deletes_old_finished_tasks_and_a_reload_changes_what_it_keeps(start_daemon,
                                                                                   conn):
    port = free_port()
    d = start_daemon(pools={"default": {"processes": 1}},
                     metrics={"listen": f"127.0.0.1:{port}"},
                     retention={"completed": 3600, "failed": False, "cancelled": 3600,
                                "interval": 0.2, "batch_size": 2})
    mark = d.mark()
    old = [f"old-{i}" for i in range(5)]
    for task_id in old:
        _finished(conn, task_id, "COMPLETED", 2 * 3600)
    _finished(conn, "young", "COMPLETED", 600)
    _finished(conn, "kept-failed", "FAILED", 365 * 86400)  # failed: false keeps it forever
    _finished(conn, "sentinel-1", "CANCELLED", 2 * 3600)
    add_task(conn, "waiting", "orphan")  # PENDING, and older than any retention
    conn.execute("UPDATE tasks SET created_at = now() - interval '1 year', "
                 "updated_at = now() - interval '1 year' WHERE id = 'waiting'")
    add_task(conn, "ran", "echo")  # finished by the daemon just now
    wait_status(conn, ["ran"], "COMPLETED", daemons=[d])

    wait_until(lambda: not _present(conn, old + ["sentinel-1"]), 15,
               message="the old finished tasks to be deleted")
    # A pass visits FAILED before CANCELLED, and a pass that starts after sentinel-1 went
    # saw kept-failed for certain: when sentinel-2 goes, kept-failed was passed over.
    _finished(conn, "sentinel-2", "CANCELLED", 2 * 3600)
    wait_until(lambda: not _present(conn, ["sentinel-2"]), 15, message="sentinel-2 to go")
    assert _present(conn, ["young", "kept-failed", "waiting", "ran"]) == {
        "young", "kept-failed", "waiting", "ran"}

    deleted = d.find("retention_deleted", mark)
    assert {e["status"] for e in deleted} == {"COMPLETED", "CANCELLED"}, deleted
    assert sum(e["deleted"] for e in deleted if e["status"] == "COMPLETED") == 5, deleted
    assert all(1 <= e["deleted"] <= 2 for e in deleted), deleted  # batch_size 2
    assert {e["older_than_seconds"] for e in deleted} == {3600}, deleted
    samples = d.metrics()
    assert metric_sum(samples, "pgtaskd_tasks_deleted_total", status="COMPLETED") == 5
    assert metric_sum(samples, "pgtaskd_tasks_deleted_total", status="CANCELLED") == 2

    # A reload that gives failed tasks a retention applies to the running daemon.
    d.tree["retention"]["failed"] = 86400
    d.write_config()
    mark = d.mark()
    d.send(signal.SIGHUP)
    d.wait_for("reload_finished", since=mark, timeout=30)
    d.wait_for("retention_deleted", since=mark, status="FAILED", deleted=1,
               older_than_seconds=86400, timeout=15)
    assert not _present(conn, ["kept-failed"])
    assert _present(conn, ["young", "waiting", "ran"]) == {"young", "waiting", "ran"}


# -- process titles ---------------------------------------------------------------------------


def test_process_titles_show_in_proc_cmdline(start_daemon, conn):
    d = start_daemon(pools={"default": {"processes": 2}})
    assert cmdline(d.pid) == f"pgtaskd: supervisor {d.config_path.resolve()}"
    children = d.children()
    assert len(children) == 2
    wait_until(lambda: sorted(cmdline(pid) for pid in children) ==
               ["pgtaskd: worker default#1 idle", "pgtaskd: worker default#2 idle"], 10,
               message=f"idle titles (are {[cmdline(p) for p in children]})")

    add_task(conn, "titled", "slow", {"seconds": 1})
    child = d.wait_for("task_claimed", task_id="titled")["pid"]
    slot = d.find("worker_spawned", child_pid=child)[0]["slot"]
    wait_running_title(child, "titled")
    assert cmdline(child) == f"pgtaskd: worker default#{slot} running titled"
    wait_status(conn, ["titled"], "COMPLETED", daemons=[d])
    wait_until(lambda: cmdline(child) == f"pgtaskd: worker default#{slot} idle", 10,
               message="the title to go back to idle")
