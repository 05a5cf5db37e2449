"""Bulk retry, cancel and purge by filter (the client's *_matching calls) against a real
PostgreSQL: what each filter takes and leaves, batches, unique keys, dry runs that write
nothing, rows that change under a running action, and what each batch's statements read."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import psycopg
import psycopg.sql
import pytest

from conftest import wait_until
from supervisor import Client, TaskFilter
from supervisor.db import store
from supervisor.db.queries import QUERIES
from supervisor.errors import UsageError
from worker_fixtures import received

from test_client import client  # noqa: F401

pytest_plugins = ["worker_fixtures"]

HOUR = 3600.0


def add(conn, task_id: str, status: str, task_type: str = "a", *, hours_ago: float = 0.0,
        error: str | None = None, name: str = "task", unique_key: str | None = None,
        undated: bool = False) -> None:
    """A task in ``status``, finished (or, PENDING, submitted) ``hours_ago``; ``undated``: a
    finished row written by hand without a finished_at, last updated that long ago."""
    finished = status in ("COMPLETED", "FAILED", "CANCELLED") and not undated
    conn.execute(
        "INSERT INTO tasks (id, name, task_type, status, claimed_by, error_message, unique_key,"
        "                   created_at, updated_at, finished_at) "
        "VALUES (%(id)s, %(name)s, %(type)s, %(status)s, "
        "        CASE WHEN %(status)s = 'RUNNING' THEN 'w' END, %(error)s, %(key)s, "
        "        now() - %(ago)s * interval '1 hour', now() - %(ago)s * interval '1 hour', "
        "        CASE WHEN %(finished)s THEN now() - %(ago)s * interval '1 hour' END)",
        {"id": task_id, "name": name, "type": task_type, "status": status, "error": error,
         "key": unique_key, "ago": hours_ago, "finished": finished})


def table(conn) -> dict[str, dict]:
    """Every row, with the system columns a write or a row lock would change."""
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        rows = cur.execute("SELECT xmin::text AS row_xmin, xmax::text AS row_xmax, * "
                           "FROM tasks ORDER BY id").fetchall()
    return {row["id"]: row for row in rows}


def statuses(conn) -> dict[str, str]:
    return dict(conn.execute("SELECT id, status FROM tasks").fetchall())


# --- what each filter takes ------------------------------------------------------------------

def add_mixed_tasks(conn) -> None:
    add(conn, "a-recent-timeout", "FAILED", hours_ago=0.1, name="nightly import",
        error="TimeoutError: took 50%_ of the budget")
    add(conn, "a-recent-boom", "FAILED", hours_ago=0.2, name="import", error="ValueError: boom")
    # '50%_' read as a LIKE pattern would match "50xx" too.
    add(conn, "a-old-timeout", "FAILED", hours_ago=5, name="nightly import",
        error="timeout after 50xx")
    add(conn, "b-recent-timeout", "FAILED", "b", hours_ago=0.1, error="Timeout",
        unique_key="k-b")
    add(conn, "a-cancelled", "CANCELLED", hours_ago=0.3)
    add(conn, "a-undated", "FAILED", hours_ago=10, error="boom", undated=True)
    add(conn, "a-completed", "COMPLETED", hours_ago=0.1)
    add(conn, "a-completed-old", "COMPLETED", hours_ago=30)
    add(conn, "p-a-new", "PENDING", hours_ago=0.1)
    add(conn, "p-a-old", "PENDING", hours_ago=5, name="nightly import")
    add(conn, "p-b-new", "PENDING", "b", hours_ago=0.1, error="timeout (will retry)")
    add(conn, "r-a", "RUNNING", hours_ago=0.1)


def hours(n: float) -> timedelta:
    return timedelta(hours=n)


FILTER_CASES = [
    ("retry", {"task_types": ["a"]},
     {"a-recent-timeout", "a-recent-boom", "a-old-timeout", "a-cancelled", "a-undated"}),
    ("retry", {"task_types": ["a"], "statuses": ["FAILED"]},
     {"a-recent-timeout", "a-recent-boom", "a-old-timeout", "a-undated"}),
    ("retry", {"since": hours(1)},
     {"a-recent-timeout", "a-recent-boom", "b-recent-timeout", "a-cancelled"}),
    ("retry", {"before": hours(1)}, {"a-old-timeout", "a-undated"}),
    ("retry", {"since": hours(1), "before": hours(0.15)}, {"a-recent-boom", "a-cancelled"}),
    ("retry", {"error": "50%_"}, {"a-recent-timeout"}),
    ("retry", {"error": "TIMEOUT"}, {"a-recent-timeout", "a-old-timeout", "b-recent-timeout"}),
    ("retry", {"id_prefix": "b-"}, {"b-recent-timeout"}),
    ("retry", {"name_prefix": "nightly"}, {"a-recent-timeout", "a-old-timeout"}),
    ("retry", {"unique_key": "k-b"}, {"b-recent-timeout"}),
    ("retry", {"task_types": ["b", "a"], "since": hours(1), "error": "timeout"},
     {"a-recent-timeout", "b-recent-timeout"}),
    ("cancel", {"task_types": ["a"]}, {"p-a-new", "p-a-old"}),
    ("cancel", {"statuses": ["PENDING"]}, {"p-a-new", "p-a-old", "p-b-new"}),
    ("cancel", {"since": hours(1)}, {"p-a-new", "p-b-new"}),
    ("cancel", {"before": hours(1), "name_prefix": "nightly"}, {"p-a-old"}),
    ("cancel", {"error": "timeout"}, {"p-b-new"}),
    ("purge", {"statuses": ["COMPLETED"]}, {"a-completed", "a-completed-old"}),
    ("purge", {"before": hours(1)}, {"a-old-timeout", "a-undated", "a-completed-old"}),
    ("purge", {"task_types": ["b"]}, {"b-recent-timeout"}),
    ("purge", {"statuses": ["FAILED"], "error": "boom"}, {"a-recent-boom", "a-undated"}),
]
AFTER = {"retry": "PENDING", "cancel": "CANCELLED", "purge": None}


@pytest.mark.parametrize("action, filters, expected", FILTER_CASES,
                         ids=[f"{a}-{'-'.join(f)}" for a, f, _ in FILTER_CASES])
def test_each_filter_takes_exactly_its_tasks_and_leaves_every_other_row_as_it_was(
        db_dsn, conn, action, filters, expected):
    add_mixed_tasks(conn)
    before = table(conn)
    with Client(db_dsn) as client:
        act = getattr(client, f"{action}_matching")
        counted = act(dry_run=True, batch_size=2, **filters)
        assert table(conn) == before, "a dry run wrote"
        outcome = act(batch_size=2, **filters)
    assert (counted.matched, counted.changed) == (len(expected), 0)
    assert (outcome.matched, outcome.changed, outcome.skipped) == (len(expected),) * 2 + (0,)
    after = table(conn)
    for task_id, row in before.items():
        if task_id not in expected:
            assert after[task_id] == row, task_id
        elif AFTER[action] is None:
            assert task_id not in after
        else:
            assert after[task_id]["status"] == AFTER[action], task_id


def test_a_bulk_retry_resets_a_task_as_a_retry_of_its_id_does(client, conn):
    add(conn, "one", "FAILED", error="boom")
    add(conn, "two", "FAILED", error="boom")
    conn.execute("UPDATE tasks SET retry_count = 3, lease_token = 7, scheduled_time = "
                 "'2040-01-01Z' WHERE status = 'FAILED'")
    client.retry("one")
    client.retry_matching(id_prefix="two")
    one, two = table(conn)["one"], table(conn)["two"]
    for column in ("status", "retry_count", "error_message", "claimed_by", "lease_token",
                   "lease_until", "finished_at", "staged"):
        assert one[column] == two[column], column
    assert two["scheduled_time"] <= conn.execute("SELECT now()").fetchone()[0]


def test_a_bulk_cancel_ends_pending_tasks_as_a_cancel_of_their_id_does(client, conn):
    add(conn, "one", "PENDING")
    add(conn, "two", "PENDING")
    client.cancel("one")
    client.cancel_matching(id_prefix="two")
    one, two = table(conn)["one"], table(conn)["two"]
    for column in ("status", "claimed_by", "lease_token", "lease_until"):
        assert one[column] == two[column], column
    assert two["finished_at"] is not None


# --- batches ---------------------------------------------------------------------------------

@pytest.mark.parametrize("action, status", [("retry", "FAILED"), ("cancel", "PENDING"),
                                            ("purge", "COMPLETED")])
def test_ten_tasks_in_batches_of_three_go_three_at_a_time(client, conn, action, status):
    for n in range(10):
        add(conn, f"t{n}", status, "a" if n < 6 else "b", hours_ago=1 - n / 100)
    seen = []
    outcome = getattr(client, f"{action}_matching")(
        statuses=[status], batch_size=3, progress=lambda o: seen.append(o.changed))
    assert outcome.changed == 10
    # Type a: 3, 3, then an empty read; type b: 3, then 1 (a short read ends the walk).
    assert seen == [3, 6, 6, 9, 10] and outcome.batches == 5
    kept = statuses(conn)
    assert len(kept) == (0 if action == "purge" else 10)
    assert set(kept.values()) <= {AFTER[action]}


def test_max_tasks_stops_the_action_and_refusals_do_not_count_toward_it(client, conn):
    add(conn, "live", "PENDING", unique_key="k")
    for n in range(6):
        add(conn, f"t{n}", "FAILED", hours_ago=1 - n / 100, unique_key="k" if n < 2 else None)
    dry = client.retry_matching(task_types=["a"], max_tasks=3, batch_size=2, dry_run=True)
    outcome = client.retry_matching(task_types=["a"], max_tasks=3, batch_size=2)
    assert (dry.matched, dry.refused, dry.reached_max) == (5, 2, True)
    assert (outcome.changed, outcome.refused, outcome.reached_max) == (3, 2, True)
    assert [t for t, s in sorted(statuses(conn).items()) if s == "PENDING"] == \
        ["live", "t2", "t3", "t4"]


def test_a_dry_run_stops_counting_past_ten_thousand_unless_given_more(client, conn):
    conn.execute("INSERT INTO tasks (id, name, task_type, status, finished_at) "
                 "SELECT 'f' || g, 'n', 'a', 'FAILED', now() FROM generate_series(1, 10050) g")
    capped = client.retry_matching(task_types=["a"], dry_run=True)
    assert (capped.matched, capped.at_least) == (10_001, True)
    counted = client.retry_matching(task_types=["a"], dry_run=True, max_tasks=20_000)
    assert (counted.matched, counted.at_least, counted.reached_max) == (10_050, False, False)


# --- unique keys -----------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1, 10])
def test_a_unique_key_held_by_a_live_task_refuses_the_retry_and_is_counted(client, conn,
                                                                           batch_size):
    add(conn, "holder", "PENDING", unique_key="held")
    add(conn, "blocked", "FAILED", hours_ago=3, unique_key="held")
    # Two finished tasks of one key, no live holder: the first retried holds it, and the
    # second is refused, in one batch or across two.
    add(conn, "first", "FAILED", hours_ago=2, unique_key="twice")
    add(conn, "second", "FAILED", hours_ago=1.5, unique_key="twice")
    add(conn, "free", "FAILED", hours_ago=1)
    dry = client.retry_matching(task_types=["a"], batch_size=batch_size, dry_run=True)
    outcome = client.retry_matching(task_types=["a"], batch_size=batch_size)
    assert (dry.matched, dry.refused) == (4, 2)
    assert (outcome.matched, outcome.changed, outcome.refused, outcome.skipped) == (4, 2, 2, 0)
    assert statuses(conn) == {"holder": "PENDING", "blocked": "FAILED", "first": "PENDING",
                              "second": "FAILED", "free": "PENDING"}


def test_a_key_taken_while_the_batch_runs_refuses_the_task_without_failing_the_batch(
        client, conn, db_dsn):
    """A submit of the key commits after the batch's snapshot: the unique index refuses the
    row, and the batch runs again, seeing the holder."""
    add(conn, "old", "FAILED", unique_key="k")
    add(conn, "other", "FAILED")
    with psycopg.connect(db_dsn) as submitter:
        submitter.execute("INSERT INTO tasks (id, name, task_type, unique_key) "
                          "VALUES ('new', 'n', 'a', 'k')")
        done = []
        worker = threading.Thread(target=lambda: done.append(
            client.retry_matching(task_types=["a"])))
        worker.start()
        # The retry waits on the uncommitted key: the index cannot tell yet if it is taken.
        wait_until(lambda: conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()").fetchone()[0] == 1, message="blocked retry")
        submitter.commit()
        worker.join(10)
    (outcome,) = done
    assert (outcome.changed, outcome.refused, outcome.skipped) == (1, 1, 0)
    assert statuses(conn) == {"old": "FAILED", "other": "PENDING", "new": "PENDING"}


# --- rows that change under a running action -------------------------------------------------

def test_a_row_another_session_retried_between_read_and_write_counts_as_skipped(
        client, conn, db_dsn, monkeypatch):
    for n in range(10):
        add(conn, f"t{n}", "FAILED", hours_ago=1 - n / 100)
    write = store.retry_scanned

    def someone_retries_first(connection, ids, **kwargs):
        if ids[0] == "t3":
            with Client(db_dsn) as someone:
                someone.retry("t4")
        return write(connection, ids, **kwargs)

    monkeypatch.setattr(store, "retry_scanned", someone_retries_first)
    outcome = client.retry_matching(task_types=["a"], batch_size=3)
    assert (outcome.matched, outcome.changed, outcome.skipped) == (10, 9, 1)
    assert set(statuses(conn).values()) == {"PENDING"}
    assert conn.execute("SELECT retry_count FROM tasks WHERE id = 't4'").fetchone()[0] == 0


def test_a_task_that_fails_again_while_the_retry_runs_is_not_retried_twice(client, conn,
                                                                            db_dsn):
    """Between batches: t0, retried by the first batch, runs and fails again; t8 is retried by
    someone else and fails again. Both finished after the action began: not met again."""
    for n in range(10):
        add(conn, f"t{n}", "FAILED", hours_ago=1 - n / 100)

    def between_batches(outcome):
        if outcome.batches == 1:
            with Client(db_dsn) as someone:
                someone.retry("t8")
            conn.execute("UPDATE tasks SET status = 'FAILED', finished_at = clock_timestamp(), "
                         "error_message = 'again' WHERE id IN ('t0', 't8')")

    outcome = client.retry_matching(task_types=["a"], batch_size=3, progress=between_batches)
    assert (outcome.matched, outcome.changed, outcome.skipped) == (9, 9, 0)
    assert {t for t, s in statuses(conn).items() if s == "FAILED"} == {"t0", "t8"}


def test_a_row_held_locked_by_another_session_is_skipped_not_waited_for(client, conn,
                                                                        db_dsn):
    for n in range(4):
        add(conn, f"t{n}", "FAILED")
    with psycopg.connect(db_dsn) as holder:
        holder.execute("SELECT 1 FROM tasks WHERE id = 't2' FOR UPDATE")
        done = []
        worker = threading.Thread(target=lambda: done.append(
            client.retry_matching(task_types=["a"], batch_size=3)))
        worker.start()
        worker.join(10)
        assert not worker.is_alive(), "the retry waited for the lock"
    (outcome,) = done
    assert (outcome.matched, outcome.changed, outcome.skipped) == (4, 3, 1)
    assert statuses(conn)["t2"] == "FAILED"


def test_running_tasks_are_never_taken_by_a_bulk_cancel_or_purge(client, conn):
    add(conn, "running", "RUNNING")
    add(conn, "pending", "PENDING")
    assert client.cancel_matching(task_types=["a"]).changed == 1
    assert client.purge_matching(task_types=["a"], statuses=["CANCELLED"]).changed == 1
    assert statuses(conn) == {"running": "RUNNING"}


def test_on_a_borrowed_connection_the_batches_are_the_callers_transaction(db_dsn, conn):
    add(conn, "t1", "FAILED")
    with psycopg.connect(db_dsn) as app:
        with app.transaction(force_rollback=True):
            assert Client(app).retry_matching(task_types=["a"], batch_size=1).changed == 1
    assert statuses(conn) == {"t1": "FAILED"}


# --- wake-ups --------------------------------------------------------------------------------

def test_a_bulk_retry_wakes_workers_once_per_batch_not_once_per_task(client, conn, listener):
    for n in range(10):
        add(conn, f"t{n}", "FAILED")
    received(listener, wait=0.1)
    client.retry_matching(task_types=["a"], batch_size=4)
    notices = received(listener)
    # Each batch commits on its own; PostgreSQL folds its 4 identical notifications into one.
    assert notices == [{"types": ["a"], "due": 1, "delay": None, "schema": "public"}] * 3


# --- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("call, message", [
    (lambda c: c.retry_matching(), "give at least one filter"),
    (lambda c: c.retry_matching(statuses=["PENDING"]), "retry takes FAILED or CANCELLED"),
    (lambda c: c.cancel_matching(statuses=["RUNNING"]), "cancel a RUNNING task by its id"),
    (lambda c: c.purge_matching(statuses=["PENDING"]), "not PENDING"),
    (lambda c: c.purge_matching(statuses=["DONE"]), "statuses: unknown status 'DONE'"),
    (lambda c: c.retry_matching(task_types=[""]), "task_types: a task type must not be empty"),
    (lambda c: c.retry_matching(task_types=[1]), "task_types: must be a string"),
    (lambda c: c.retry_matching(error=""), "error: must not be empty"),
    (lambda c: c.retry_matching(error="x\x00"), "error: must not contain NUL"),
    (lambda c: c.retry_matching(since="1h"), "since: must be a datetime or a timedelta"),
    (lambda c: c.retry_matching(since=timedelta(hours=-1)), "since: a duration back"),
    (lambda c: c.retry_matching(since=hours(1), before=hours(2)), "the window is empty"),
    (lambda c: c.retry_matching(task_type="a"), "task_type: not a filter"),
    (lambda c: c.retry_matching(TaskFilter(task_types=["a"]), error="x"), "not both"),
    (lambda c: c.retry_matching(task_types=["a"], batch_size=0), "batch_size: must be 1"),
    (lambda c: c.retry_matching(task_types=["a"], max_tasks=0), "max_tasks: must be 1"),
])
def test_a_bad_filter_raises_usage_error_naming_its_field_and_writes_nothing(client, conn,
                                                                             call, message):
    add(conn, "t1", "FAILED")
    before = table(conn)
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        call(client)
    assert table(conn) == before


# --- what a batch reads ----------------------------------------------------------------------

SCANS = {
    "scan_finished_tasks": ("FAILED", "tasks_finished_walk_idx"),
    "scan_pending_tasks": ("PENDING", "tasks_pending_walk_idx"),
}
# Rows a batch of type a's FAILED (or PENDING) tasks in the last hour must not read: other
# types, other statuses, and its own type's tasks outside the window.
OTHER_ROWS = (
    "INSERT INTO tasks (id, name, task_type, status, claimed_by, created_at, finished_at) "
    "SELECT 'skew' || %(from)s || '-' || g, 'n', skewed.task_type, skewed.status, "
    "       CASE WHEN skewed.status = 'RUNNING' THEN 'w' END, skewed.at, "
    "       CASE WHEN skewed.status NOT IN ('PENDING', 'RUNNING') THEN skewed.at END "
    "FROM generate_series(1, %(n)s) g "
    "CROSS JOIN LATERAL (SELECT "
    "    CASE WHEN g %% 3 = 0 THEN 'b' || (g %% 7) ELSE 'a' END AS task_type, "
    "    (ARRAY['PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED'])[1 + g %% 5] "
    "        AS status, "
    "    CASE WHEN g %% 3 = 0 THEN now() ELSE now() - interval '3 hours' END AS at) AS skewed")


def scan_params(status: str, since: str) -> dict:
    after_position, after_id = store.walk_start((since, "infinity"))
    return {"status": status, "task_type": "a", "since": since, "before": "infinity",
            "after_position": after_position, "after_id": after_id, "limit": 10,
            "with_holders": True, "error": None, "id_prefix": None, "name_prefix": None,
            "unique_key": "k"}


def plan_of(conn, name: str, params: dict, *, generic: bool = False) -> tuple[dict, int]:
    """The plan of the named query run once (rolled back), and the buffers it touched.
    ``generic``: prepared, with the plan PostgreSQL makes once for any values (psycopg
    prepares a statement the fifth time a connection runs it)."""
    statement = psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[name])
    arguments = params
    if generic:
        names: list[str] = []

        def placeholder(match: re.Match) -> str:
            if match[1] not in names:
                names.append(match[1])
            return f"${names.index(match[1]) + 1}"

        text = re.sub(r"%\((\w+)\)s", placeholder, QUERIES[name]).replace("%%", "%")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("DEALLOCATE ALL")
        conn.execute(f"PREPARE batch AS {text}")
        statement = psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE batch ({})"
                                    ).format(psycopg.sql.SQL(", ").join(
                                        psycopg.sql.Literal(params[n]) for n in names))
        arguments = None
    try:
        with conn.transaction(force_rollback=True):
            plan = conn.execute(statement, arguments).fetchone()[0][0]["Plan"]
    finally:
        if generic:
            conn.execute("RESET plan_cache_mode")
    return plan, plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


@pytest.mark.parametrize("name", sorted(SCANS))
def test_a_batch_reads_its_own_rows_whatever_else_the_table_holds(conn, name):
    status, index = SCANS[name]
    mine = ("INSERT INTO tasks (id, name, task_type, status, finished_at) "
            "SELECT %(prefix)s || g, 'n', 'a', %(status)s, "
            "       CASE WHEN %(status)s <> 'PENDING' THEN now() - g * interval '1 ms' END "
            "FROM generate_series(1, %(n)s) g")
    conn.execute(mine, {"prefix": "mine", "status": status, "n": 30})
    params = scan_params(status, since=conn.execute(
        "SELECT (now() - interval '1 hour')::text").fetchone()[0])
    measured = []
    # Then rows a batch of 10 must not read: other types, other statuses, type a outside the
    # window; then thousands more of its own range, beyond its 10.
    for skew in (None, lambda: conn.execute(OTHER_ROWS, {"from": 1, "n": 20_000}),
                 lambda: conn.execute(mine, {"prefix": "more", "status": status, "n": 20_000})):
        if skew:
            skew()
        conn.execute("ANALYZE tasks")
        # On 30 rows the planner reads the table, rightly; from 20,030 on, never; and once its
        # range is large it reads it in order and stops at 10 rows, where a bitmap of the
        # range (fine for 30 rows) would read all of it.
        for generic in (False, True) if skew else ():
            plan, _ = plan_of(conn, name, params, generic=generic)
            assert not [node for node in nodes(plan) if node["Node Type"] == "Seq Scan"], plan
            walks = [node for node in nodes(plan) if node.get("Index Name") == index]
            assert walks, (generic, plan)
            if len(measured) == 2:
                assert walks[0]["Node Type"] == "Index Scan", (generic, plan)
            assert plan["Actual Rows"] == 10
        plan_of(conn, name, params)  # the first run reads the catalog too
        measured.append(plan_of(conn, name, params)[1])
    # Ten rows: a page of the index and one of the table each, at most, then a B-tree level
    # more at most for 20,000 rows of its own range (the first figure: a read of one page).
    print(f"\n{name}: buffers {measured}")
    assert measured[1] <= 25 and measured[2] <= measured[1] + 3, measured


@pytest.mark.parametrize("name, params", [
    ("retry_scanned", {"status": "FAILED"}),
    ("cancel_scanned", {}),
    ("purge_scanned", {"status": "COMPLETED"}),
    ("next_finished_type", {"status": "FAILED", "after": "a"}),
    ("next_pending_type", {"status": "PENDING", "after": None}),
])
def test_a_batch_write_and_a_type_probe_read_no_table(conn, name, params):
    conn.execute(OTHER_ROWS, {"from": 1, "n": 20_000})
    conn.execute("ANALYZE tasks")
    ids = [row[0] for row in conn.execute("SELECT id FROM tasks LIMIT 10")]
    plan, _ = plan_of(conn, name, {"ids": ids, "since": "-infinity", "before": "infinity",
                                   **params})
    assert not [n for n in nodes(plan) if n["Node Type"] == "Seq Scan"], plan
