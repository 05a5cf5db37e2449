"""Retention: old finished tasks are deleted in batches, by the database's clock, from any
number of daemons at once; PENDING, RUNNING and young finished tasks are never touched.

Ages are made by moving rows into the past (finished_at = now() - age), never by sleeping.
"""

from __future__ import annotations

import re
import threading

import psycopg
import pytest
from psycopg import sql

from conftest import add_task, wait_until
from supervisor.config import RetentionConfig
from supervisor.db import store
from supervisor.db.queries import QUERIES
from supervisor.maintenance.retention import RetentionService

pytest_plugins = ["worker_fixtures"]

HOUR = 3600.0
DAY = 86400.0
# A different retention per status, so that a row deleted by another status's period shows.
POLICY = RetentionConfig(completed=HOUR, failed=DAY, cancelled=2 * DAY, batch_size=1000)
PERIODS = {"COMPLETED": HOUR, "FAILED": DAY, "CANCELLED": 2 * DAY}


@pytest.fixture
def retention_service(db_dsn):
    """Build RetentionServices on the test database (not started); connections closed after."""
    built: list[RetentionService] = []

    def build(policy: RetentionConfig = POLICY, **kwargs) -> RetentionService:
        service = RetentionService(db_dsn, policy=policy, **kwargs)
        built.append(service)
        return service

    yield build
    for service in built:
        if service.is_alive():
            service.stop()
        service._close()


def add_finished(conn, task_id: str, status: str, age: float | None, *,
                 updated_age: float | None = None) -> str:
    """A task that reached ``status`` ``age`` seconds ago by the database's clock; ``age``
    None leaves finished_at NULL (a row marked finished by hand), aged by ``updated_age``."""
    add_task(conn, task_id)
    conn.execute("UPDATE tasks SET status = %(status)s, "
                 "finished_at = now() - %(age)s * interval '1 second', "
                 "updated_at = now() - coalesce(%(updated_age)s, %(age)s, 0) * interval '1 second' "
                 "WHERE id = %(id)s",
                 {"status": status, "age": age, "updated_age": updated_age, "id": task_id})
    return task_id


def add_many_finished(conn, prefix: str, status: str, count: int, age: float) -> None:
    """``count`` tasks of ``status`` that finished ``age`` seconds ago (give or take a ms each)."""
    conn.execute("INSERT INTO tasks (id, name, task_type, status, finished_at, updated_at) "
                 "SELECT %(prefix)s || g, 'n', 'echo', %(status)s, "
                 "now() - %(age)s * interval '1 second' - g * interval '1 millisecond', now() "
                 "FROM generate_series(1, %(count)s) g",
                 {"prefix": prefix, "status": status, "age": age, "count": count})


def remaining(conn) -> set[str]:
    return {row[0] for row in conn.execute("SELECT id FROM tasks")}


def count_like(conn, prefix: str) -> int:
    return conn.execute("SELECT count(*) FROM tasks WHERE id LIKE %s",
                        (prefix + "%",)).fetchone()[0]


# -- what is deleted, what is kept ----------------------------------------------------------


def test_old_finished_tasks_go_and_young_unfinished_and_live_ones_stay(conn, retention_service):
    for status, period in PERIODS.items():
        add_finished(conn, f"old-{status}", status, period + 60)
        add_finished(conn, f"young-{status}", status, period - 60)
    # Two hours old: past COMPLETED's hour, far inside FAILED's day.
    add_finished(conn, "two-hours-FAILED", "FAILED", 2 * HOUR)
    # Unfinished tasks, however old every timestamp on them is, are never candidates, not
    # even one whose finished_at an operator left behind.
    add_task(conn, "pending")
    add_task(conn, "running")
    conn.execute("UPDATE tasks SET status = 'RUNNING', claimed_by = 'w', lease_token = 1, "
                 "lease_until = now() + interval '1 hour' WHERE id = 'running'")
    conn.execute("UPDATE tasks SET created_at = now() - interval '1 year', "
                 "updated_at = now() - interval '1 year', "
                 "finished_at = now() - interval '1 year' WHERE id IN ('pending', 'running')")

    deleted = retention_service().run_once()

    assert deleted == {"COMPLETED": 1, "FAILED": 1, "CANCELLED": 1}
    assert remaining(conn) == {"young-COMPLETED", "young-FAILED", "young-CANCELLED",
                               "two-hours-FAILED", "pending", "running"}


def test_a_task_without_finished_at_is_aged_by_its_updated_at(conn, retention_service):
    add_finished(conn, "undated-old", "COMPLETED", None, updated_age=2 * HOUR)
    add_finished(conn, "undated-young", "COMPLETED", None, updated_age=HOUR - 60)
    # finished_at, when present, is what counts, whatever updated_at says.
    add_finished(conn, "dated-young", "COMPLETED", HOUR - 60, updated_age=2 * HOUR)

    assert retention_service().run_once() == {"COMPLETED": 1}
    assert remaining(conn) == {"undated-young", "dated-young"}


def test_a_status_kept_forever_is_never_deleted(conn, retention_service):
    add_finished(conn, "ancient-completed", "COMPLETED", 9 * 365 * DAY)
    add_finished(conn, "ancient-failed", "FAILED", 9 * 365 * DAY)
    add_finished(conn, "ancient-undated-failed", "FAILED", None, updated_age=9 * 365 * DAY)
    add_finished(conn, "ancient-cancelled", "CANCELLED", 9 * 365 * DAY)
    keep_failures = RetentionConfig(completed=HOUR, failed=None, cancelled=HOUR)

    assert retention_service(keep_failures).run_once() == {"COMPLETED": 1, "CANCELLED": 1}
    assert remaining(conn) == {"ancient-failed", "ancient-undated-failed"}

    keep_all = RetentionConfig(completed=None, failed=None, cancelled=None)
    assert retention_service(keep_all).run_once() == {}
    assert remaining(conn) == {"ancient-failed", "ancient-undated-failed"}


def test_the_query_never_deletes_unfinished_tasks_whatever_status_it_is_given(conn):
    """The store refuses a live status; the SQL alone would delete nothing either."""
    add_task(conn, "pending")
    conn.execute("UPDATE tasks SET updated_at = now() - interval '1 year', "
                 "finished_at = now() - interval '1 year' WHERE id = 'pending'")
    with pytest.raises(ValueError):
        store.delete_finished_tasks(conn, status="PENDING", older_than_seconds=1, batch_size=10)
    cursor = conn.execute(QUERIES["delete_finished_tasks"],
                          {"status": "PENDING", "older_than_seconds": 1, "batch_size": 10})
    assert cursor.rowcount == 0
    assert remaining(conn) == {"pending"}


# -- batches, events, counts ----------------------------------------------------------------


def test_a_pass_deletes_in_batches_until_one_comes_back_short(conn, retention_service, events):
    add_many_finished(conn, "c", "COMPLETED", 35, 2 * HOUR)
    add_many_finished(conn, "f", "FAILED", 20, 2 * DAY)
    add_many_finished(conn, "young", "COMPLETED", 5, HOUR - 60)
    counted: list[tuple[str, int]] = []
    service = retention_service(RetentionConfig(completed=HOUR, failed=DAY, cancelled=DAY,
                                                batch_size=10),
                                on_deleted=lambda status, count: counted.append((status, count)))

    assert service.run_once() == {"COMPLETED": 35, "FAILED": 20}

    # One event per batch that deleted something: 20 FAILED rows take two full batches and an
    # empty third, which logs nothing.
    assert [(e["status"], e["deleted"], e["older_than_seconds"])
            for e in events.of("retention_deleted")] == [
        ("COMPLETED", 10, HOUR), ("COMPLETED", 10, HOUR), ("COMPLETED", 10, HOUR),
        ("COMPLETED", 5, HOUR), ("FAILED", 10, DAY), ("FAILED", 10, DAY)]
    assert counted == [(e["status"], e["deleted"]) for e in events.of("retention_deleted")]
    assert count_like(conn, "young") == 5 and len(remaining(conn)) == 5

    # A pass with nothing to delete logs nothing and counts nothing.
    assert service.run_once() == {}
    assert len(events.of("retention_deleted")) == 6 and len(counted) == 6


def test_each_batch_deletes_the_oldest_first(conn):
    add_many_finished(conn, "c", "COMPLETED", 30, 2 * HOUR)
    assert store.delete_finished_tasks(conn, status="COMPLETED", older_than_seconds=HOUR,
                                       batch_size=10) == 10
    # add_many_finished ages row g by g more milliseconds: c21..c30 were the oldest.
    assert remaining(conn) == {f"c{g}" for g in range(1, 21)}


def test_a_stopping_service_ends_its_pass_after_the_current_batch(conn, retention_service):
    add_many_finished(conn, "c", "COMPLETED", 50, 2 * HOUR)
    service = retention_service(RetentionConfig(completed=HOUR, batch_size=10),
                                on_deleted=lambda status, count: service._stop_event.set())

    assert service.run_once() == {"COMPLETED": 10}
    assert count_like(conn, "c") == 40


def test_the_service_thread_deletes_on_its_interval_and_stops(conn, retention_service):
    service = retention_service(RetentionConfig(completed=HOUR, interval=0.05, batch_size=10))
    service.start()
    add_many_finished(conn, "c", "COMPLETED", 25, 2 * HOUR)
    wait_until(lambda: count_like(conn, "c") == 0, timeout=10,
               message="the service thread to delete the old tasks")
    service.stop(timeout=10)
    assert not service.is_alive()


# -- many daemons, other sessions -----------------------------------------------------------


def test_two_services_at_once_split_the_work_and_both_finish(conn, retention_service):
    """Two daemons' passes on one database: every old row is deleted by exactly one of them
    (the counts add up to the rows there were), young rows stay, and both passes end."""
    add_many_finished(conn, "old", "COMPLETED", 1500, 2 * HOUR)
    add_many_finished(conn, "young", "COMPLETED", 200, HOUR - 60)
    add_many_finished(conn, "failed", "FAILED", 300, 2 * DAY)
    policy = RetentionConfig(completed=HOUR, failed=DAY, cancelled=DAY, batch_size=7)
    services = [retention_service(policy), retention_service(policy)]
    for service in services:
        service.connection()  # connect first, so that the passes start together
    start = threading.Barrier(len(services))
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            start.wait(10)
            results[index] = services[index].run_once()
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(services))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a pass did not finish"
    assert not errors, errors

    for status, total in (("COMPLETED", 1500), ("FAILED", 300)):
        assert sum(r.get(status, 0) for r in results.values()) == total, results
    # Both really worked at once: each took a share (SKIP LOCKED splits the batches).
    assert all(r.get("COMPLETED", 0) > 0 for r in results.values()), results
    assert count_like(conn, "old") == 0 and count_like(conn, "failed") == 0
    assert count_like(conn, "young") == 200


def test_rows_locked_by_another_session_are_skipped_not_waited_for(conn, db_dsn,
                                                                    retention_service):
    """An operator's open transaction holds two old rows. The pass deletes the rest without
    waiting (its connection's lock_timeout would turn a wait into an error), and a later
    pass deletes the two once they are free."""
    add_many_finished(conn, "c", "COMPLETED", 20, 2 * HOUR)
    service = retention_service(RetentionConfig(completed=HOUR, batch_size=5))
    with psycopg.connect(db_dsn) as operator:
        operator.execute("SELECT id FROM tasks WHERE id IN ('c1', 'c2') FOR UPDATE")
        assert service.run_once() == {"COMPLETED": 18}
        assert remaining(conn) == {"c1", "c2"}
        operator.rollback()
    assert service.run_once() == {"COMPLETED": 2}
    assert remaining(conn) == set()


# -- the plan -------------------------------------------------------------------------------


def plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


def assert_served_by_the_finished_index(plan: dict) -> None:
    """No sequential scan anywhere; the selection (the doomed CTE) reads tasks only through
    tasks_finished_idx, in both of its branches."""
    nodes = list(plan_nodes(plan))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], plan
    [selection] = [n for n in nodes if n.get("Subplan Name") == "CTE doomed"]
    reads = list(plan_nodes(selection))
    scan_types = {n["Node Type"] for n in reads if n.get("Relation Name") == "tasks"}
    assert scan_types <= {"Index Scan", "Index Only Scan", "Bitmap Heap Scan"}, plan
    indexes = [n["Index Name"] for n in reads if "Index Name" in n]
    assert len(indexes) == 2 and set(indexes) == {"tasks_finished_idx"}, plan


@pytest.fixture
def big_table(conn):
    """Enough of everything that reading the whole table would be the planner's pick if
    the index did not apply."""
    for status in ("COMPLETED", "FAILED", "CANCELLED"):
        add_many_finished(conn, status.lower(), status, 20_000, 2 * DAY)
    conn.execute("INSERT INTO tasks (id, name, task_type) "
                 "SELECT 'pending' || g, 'n', 'echo' FROM generate_series(1, 20000) g")
    conn.execute("ANALYZE tasks")
    return conn


PARAMS = {"older_than_seconds": DAY, "batch_size": 1000}


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "CANCELLED"])
def test_the_selection_is_served_by_the_finished_index(big_table, status):
    plan = big_table.execute("EXPLAIN (FORMAT JSON) " + QUERIES["delete_finished_tasks"],
                             {"status": status, **PARAMS}).fetchone()[0][0]["Plan"]
    assert_served_by_the_finished_index(plan)


def test_the_generic_plan_is_served_by_the_finished_index_too(big_table):
    """psycopg prepares a statement the fifth time a connection runs it, and PostgreSQL may
    then plan it once for any status: that plan must use the index as well."""
    names: list[str] = []

    def placeholder(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    body = re.sub(r"%\((\w+)\)s", placeholder, QUERIES["delete_finished_tasks"])
    types = {"status": "text", "older_than_seconds": "float8", "batch_size": "integer"}
    big_table.execute("SET plan_cache_mode = force_generic_plan")
    big_table.execute(f"PREPARE retention_batch({', '.join(types[n] for n in names)}) AS {body}")
    values = {"status": "FAILED", **PARAMS}
    execute = sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE retention_batch({})").format(
        sql.SQL(", ").join(sql.Literal(values[n]) for n in names))
    plan = big_table.execute(execute).fetchone()[0][0]["Plan"]
    assert_served_by_the_finished_index(plan)
    # Generic indeed: the status is still a parameter where the index is searched.
    assert any("status = $1" in n.get("Index Cond", "") for n in plan_nodes(plan)), plan
