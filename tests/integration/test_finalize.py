"""The final write must survive a connection that drops while the handler runs or mid-write."""

from __future__ import annotations

import threading

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from conftest import make_config, wait_until
from supervisor.db import store
from worker_fixtures import add_task, expire_lease, looping, recorded_runs, task_row

pytest_plugins = ["worker_fixtures"]


def dbname_of(dsn: str) -> str:
    return conninfo_to_dict(dsn)["dbname"]


def terminate_worker_backends(admin, dbname: str) -> list[int]:
    """Kill every pgtaskd connection to the test database; wait until each is gone."""
    rows = admin.execute(
        "SELECT pid, pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
        "WHERE datname = %s AND application_name LIKE 'pgtaskd%%'", (dbname,)).fetchall()
    assert all(done for _, done in rows), f"a backend outlived its termination: {rows}"
    return [pid for pid, _ in rows]


class Outage:
    """The test database refusing every connection, and the worker's connections killed."""

    ALLOW = sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}")

    def __init__(self, admin_dsn: str, dbname: str):
        self.admin_dsn = admin_dsn
        self.dbname = dbname

    def begin(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            # Refuse new connections first, so that the pool cannot quietly replace the killed.
            admin.execute(self.ALLOW.format(sql.Identifier(self.dbname), sql.SQL("false")))
            assert terminate_worker_backends(admin, self.dbname)

    def end(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(self.ALLOW.format(sql.Identifier(self.dbname), sql.SQL("true")))


def test_final_write_lands_after_the_worker_connections_were_killed(conn, db_dsn, pg_admin_dsn,
                                                                   make_worker, events):
    worker = make_worker(types=["echo"])
    dbname = dbname_of(db_dsn)
    killed: list[int] = []

    def kill_connections(task):
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            killed.extend(terminate_worker_backends(admin, dbname))

    worker.handlers["echo"] = kill_connections
    add_task(conn, "t1")

    outcome = worker.run_once()

    assert killed, "the handler found no worker connection to kill"
    assert outcome.name == "completed"
    assert task_row(conn, "t1")["status"] == "COMPLETED"
    # The write first went to the killed connection, failed, and was retried on a new one.
    assert events.of("final_write_retry"), events.names()
    alive = {pid for (pid,) in conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s "
        "AND application_name LIKE 'pgtaskd%%'", (dbname,))}
    assert alive and not alive & set(killed), "the final write did not use a new connection"


def test_final_write_retries_until_the_database_takes_connections_again(conn, db_dsn, pg_admin_dsn,
                                                                       make_worker, events):
    config = make_config(db_dsn, database={"connect_timeout": 1})
    worker = make_worker(config, types=["echo"])
    outage = Outage(pg_admin_dsn, dbname_of(db_dsn))
    # The outage starts inside the handler: the claim went through, the final write cannot.
    worker.handlers["echo"] = lambda task: outage.begin()
    add_task(conn, "t1")
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(worker.run_once()))
    runner.start()
    try:
        wait_until(lambda: events.of("final_write_retry"), timeout=20,
                   message="the worker to retry its final write")
        assert task_row(conn, "t1")["status"] == "RUNNING"
    finally:
        outage.end()
    runner.join(30)

    assert not runner.is_alive(), "the final write never got through"
    assert outcome[0].name == "completed"
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["retry_count"], stored["attempts"]) == ("COMPLETED", 0, 1)
    assert not events.of("final_state_lost")


def _answer_lost_once(real, before_raise=lambda *args: None, *, write_first: bool):
    """Wrap a store write so its first call fails as if the connection dropped.

    With ``write_first`` the write commits before the failure (only the answer is lost).
    """
    calls = []

    def wrapped(conn, *args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            if write_first:
                real(conn, *args, **kwargs)
            before_raise()
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real(conn, *args, **kwargs)

    wrapped.calls = calls
    return wrapped


def test_a_completion_whose_answer_was_lost_counts_as_completed(conn, make_worker, events,
                                                                monkeypatch):
    worker = make_worker(types=["echo"])
    write = _answer_lost_once(store.complete_tasks, write_first=True)
    monkeypatch.setattr(store, "complete_tasks", write)
    add_task(conn, "t1")

    outcome = worker.run_once()

    assert len(write.calls) == 2
    assert outcome.name == "completed", "our own committed write was taken for a lost claim"
    assert task_row(conn, "t1")["status"] == "COMPLETED"
    assert len(events.of("final_write_retry")) == 1
    assert not events.of("stale_result_discarded")


def test_a_failure_whose_answer_was_lost_is_counted_once(conn, make_worker, monkeypatch):
    worker = make_worker(types=["fail"])
    write = _answer_lost_once(store.fail_attempt, write_first=True)
    monkeypatch.setattr(store, "fail_attempt", write)
    add_task(conn, "t1", task_type="fail", max_retries=3)

    outcome = worker.run_once()

    assert len(write.calls) == 2
    assert outcome.name == "retried"
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["retry_count"]) == ("PENDING", 1)


def test_a_retried_final_write_still_yields_to_a_takeover(conn, db_dsn, make_worker, events,
                                                          monkeypatch):
    worker = make_worker(types=["echo"], worker_id="worker-1")
    taken = []

    def take_over():
        with psycopg.connect(db_dsn, autocommit=True) as other:
            expire_lease(other, "t1")
            taken.append(store.claim_task(other, worker_id="worker-2", task_types=["echo"],
                                          lease_seconds=30))

    write = _answer_lost_once(store.complete_tasks, take_over, write_first=False)
    monkeypatch.setattr(store, "complete_tasks", write)
    add_task(conn, "t1")

    outcome = worker.run_once()

    assert outcome.name == "stale"
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["claimed_by"]) == ("RUNNING", "worker-2")
    assert stored["lease_token"] == taken[0]["lease_token"]
    assert len(events.of("stale_result_discarded")) == 1


def test_a_handler_cut_off_past_its_lease_stops_and_its_run_counts_as_failed(
        conn, db_dsn, pg_admin_dsn, make_worker, events):
    config = make_config(db_dsn, lease={"seconds": 1.5, "renew_interval": 0.3},
                         database={"connect_timeout": 1})
    worker = make_worker(config, types=["cooperative"])
    outage = Outage(pg_admin_dsn, dbname_of(db_dsn))
    add_task(conn, "t1", task_type="cooperative", payload={"max_seconds": 20}, max_retries=3)
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(worker.run_once()))
    runner.start()
    wait_until(lambda: task_row(conn, "t1")["status"] == "RUNNING", message="the claim")

    outage.begin()
    try:
        # By its own clock the worker must assume the task may be someone else's by now.
        wait_until(lambda: events.of("lease_lost"), timeout=20, message="the lease to be given up")
    finally:
        outage.end()
    runner.join(30)

    assert not runner.is_alive()
    assert events.of("lease_renew_failed")
    # Nobody took the task meanwhile, so the interrupted run is ours to count as a failure.
    assert outcome[0].name == "retried"
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["retry_count"], stored["claimed_by"]) == ("PENDING", 1, None)
    assert "lease expired before a renewal got through" in stored["error_message"]


def test_the_worker_loop_waits_out_an_outage_and_claims_afterwards(conn, db_dsn, pg_admin_dsn,
                                                                   make_worker, events):
    config = make_config(db_dsn, database={"connect_timeout": 1})
    worker = make_worker(config, types=["record"])
    outage = Outage(pg_admin_dsn, dbname_of(db_dsn))
    with looping(worker):
        wait_until(lambda: events.of("worker_started"), message="the loop to start")
        outage.begin()
        try:
            add_task(conn, "t1", task_type="record")
            wait_until(lambda: events.of("loop_error"), timeout=20,
                       message="the loop to notice the outage")
            assert task_row(conn, "t1")["status"] == "PENDING"
        finally:
            outage.end()
        wait_until(lambda: task_row(conn, "t1")["status"] == "COMPLETED", timeout=30,
                   message="the task to run once the database is back")
    assert len(recorded_runs(conn, "t1")) == 1
