"""The web console's reads and the minute rollup, on a real PostgreSQL: no plan reads the
tasks table whole; pages follow one another without a duplicate or a gap, whatever the
filters and ties; the rollup counts what finished in each minute, once, whoever runs it."""

from __future__ import annotations

import psycopg
import pytest

from conftest import scratch_database
from supervisor.client import Client, ListFilter
from supervisor.client.browse import SCAN_BUDGET
from supervisor.db import store
from supervisor.db.queries import QUERIES
from supervisor.errors import UsageError

PARAMS = {"task_type": None, "id_prefix": None, "name_prefix": None, "unique_key": None,
          "error": None, "after_phase": None, "after_priority": None, "after_time": None,
          "after_created": None, "after_id": None, "scan": 51, "page": 50, "max_types": 200,
          "status": "PENDING"}
LATER_KEY = {"after_phase": "later", "after_time": "2030-01-01T00:00:00+00:00",
             "after_created": "2026-01-01T00:00:00+00:00", "after_id": "x"}
DUE_KEY = {"after_phase": "due", "after_priority": 1, "after_time": "2026-01-01T00:00:00+00:00",
           "after_created": "2026-01-01T00:00:00+00:00", "after_id": "x"}
FINISHED_KEY = {"after_time": "2026-01-01T00:00:00+00:00", "after_id": "x"}
# Every console statement, with the parameters of the pages that use it.
PLANS = [
    ("console_overview", {"known_types": ["a"], "cap": 10000, "max_types": 200,
                          "max_levels": 50}),
    ("console_activity", {"minutes": 60}),
    ("console_task", {"task_id": "p-1"}),
    ("console_pending", PARAMS),
    ("console_pending", {**PARAMS, "task_type": "t1"}),
    ("console_pending", {**PARAMS, "task_type": "t1", **DUE_KEY}),
    ("console_pending", {**PARAMS, **LATER_KEY}),
    ("console_pending", {**PARAMS, "task_type": "t2", **LATER_KEY}),
    ("console_pending", {**PARAMS, "error": "boom", "scan": SCAN_BUDGET}),
    ("console_running", {**PARAMS, "status": "RUNNING", "task_type": "t1"}),
    ("console_running", {**PARAMS, "status": "RUNNING", **FINISHED_KEY}),
    ("console_finished", {**PARAMS, "status": "FAILED"}),
    ("console_finished", {**PARAMS, "status": "COMPLETED", "task_type": "t3",
                          "scan": SCAN_BUDGET, **FINISHED_KEY}),
    ("console_finished", {**PARAMS, "status": "FAILED", "error": "boom", "id_prefix": "f",
                          "name_prefix": "n", "unique_key": "k", "scan": SCAN_BUDGET}),
    ("console_live_key_holder", {**PARAMS, "unique_key": "k-1"}),
    ("rollup_minutes", {"cap": 10000, "catch_up": 10, "max_types": 200}),
]


@pytest.fixture(scope="module")
def big_table(pg_admin_dsn, template_db):
    """200,000 finished tasks and 40,000 PENDING ones (a tenth due later), a few RUNNING,
    over five types and three priorities: large enough that the planner would read the
    table whole if an index did not serve a statement. Built once for the module."""
    with scratch_database(pg_admin_dsn, "pgtaskd_plans", template_db) as dsn, \
            psycopg.connect(dsn, autocommit=True) as conn:
        _fill(conn)
        yield conn


def _fill(conn) -> None:
    conn.execute("""
        INSERT INTO tasks (id, name, task_type, status, priority, scheduled_time, finished_at,
                           error_message, unique_key)
        SELECT 'f-' || g, 'n' || g, 't' || (g % 5), CASE WHEN g % 4 = 0 THEN 'FAILED'
                                                        ELSE 'COMPLETED' END,
               0, now() - interval '2 hours', now() - (g % 7200) * interval '1 second',
               CASE WHEN g % 4 = 0 THEN 'boom ' || g END, 'k-' || g
        FROM generate_series(1, 200000) AS g""")
    conn.execute("""
        INSERT INTO tasks (id, name, task_type, priority, scheduled_time, unique_key)
        SELECT 'p-' || g, 'n' || g, 't' || (g % 4), g % 3,
               now() - (g % 500) * interval '1 second'
                     + CASE WHEN g % 10 = 0 THEN interval '1 day' ELSE interval '0' END,
               'live-' || g
        FROM generate_series(1, 40000) AS g""")
    conn.execute("""
        INSERT INTO tasks (id, name, task_type, status, claimed_by, lease_until, started_at)
        SELECT 'r-' || g, 'n', 't1', 'RUNNING', 'w', now() + interval '1 minute', now()
        FROM generate_series(1, 20) AS g""")
    conn.execute("VACUUM ANALYZE tasks")


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


@pytest.mark.parametrize("name, params", PLANS, ids=[f"{n}-{i}" for i, (n, _) in
                                                     enumerate(PLANS)])
def test_no_console_statement_reads_the_tasks_table_whole(big_table, name, params):
    with big_table.cursor() as cur:
        # Unprepared, as the console and the rollup run them: planned for these values.
        cur.execute("EXPLAIN (FORMAT JSON) " + QUERIES[name], params, prepare=False)
        plan = cur.fetchone()[0][0]["Plan"]
    scans = [node for node in _nodes(plan) if node["Node Type"] == "Seq Scan"
             and node.get("Relation Name") == "tasks"]
    assert not scans, f"{name} reads tasks sequentially"


def _all_pages(client: Client, filters: ListFilter, page_size: int) -> tuple[list[str], int]:
    seen, after, pages = [], None, 0
    while True:
        page = client.browse(filters, after=after, page_size=page_size)
        seen += [task["id"] for task in page.tasks]
        pages += 1
        if page.after is None:
            return seen, pages
        after = page.after


def test_pending_pages_across_types_in_claim_order_then_later_ones(conn):
    # Ties on purpose: one due time, one creation time, three priorities, four types.
    conn.execute("""
        INSERT INTO tasks (id, name, task_type, priority, scheduled_time, created_at)
        SELECT 'd-' || lpad(g::text, 3, '0'), 'n', 't' || (g % 4), g % 3,
               '2026-01-01 00:00Z', '2026-01-01 00:00Z'
        FROM generate_series(1, 120) AS g""")
    conn.execute("""
        INSERT INTO tasks (id, name, task_type, priority, scheduled_time)
        SELECT 'l-' || lpad(g::text, 3, '0'), 'n', 't' || (g % 4), 9,
               now() + (g % 5) * interval '1 hour'
        FROM generate_series(1, 40) AS g""")
    expected = [row[0] for row in conn.execute(
        "SELECT id FROM tasks WHERE status = 'PENDING' ORDER BY NOT staged, "
        "CASE WHEN staged THEN -priority END, scheduled_time, "
        "CASE WHEN staged THEN created_at END, id")]
    client = Client(conn)
    seen, pages = _all_pages(client, ListFilter(status="PENDING"), 7)
    assert seen == expected
    assert pages == len(expected) // 7 + 1
    one_type, _ = _all_pages(client, ListFilter(status="PENDING", task_type="t2"), 5)
    assert one_type == [task_id for task_id in expected
                        if conn.execute("SELECT task_type FROM tasks WHERE id = %s",
                                        (task_id,)).fetchone()[0] == "t2"]


def test_a_rare_type_among_finished_tasks_is_found_a_budget_at_a_time(conn):
    total = 3 * SCAN_BUDGET - 1  # the third budget is not spent whole: it ends the list
    conn.execute("""
        INSERT INTO tasks (id, name, task_type, status, finished_at, error_message)
        SELECT 'f-' || lpad(g::text, 5, '0'), 'n', CASE WHEN g %% 500 = 0 THEN 'rare'
                                                        ELSE 'common' END,
               'FAILED', '2026-01-01 00:00Z'::timestamptz + (g / 3) * interval '1 second',
               'boom'
        FROM generate_series(1, %s) AS g""", (total,))
    client = Client(conn)
    filters = ListFilter(status="FAILED", task_type="rare")
    first = client.browse(filters, page_size=50)
    assert first.budget_spent and first.after is not None
    assert len(first.tasks) == SCAN_BUDGET // 500
    seen, pages = _all_pages(client, filters, 50)
    expected = [row[0] for row in conn.execute(
        "SELECT id FROM tasks WHERE task_type = 'rare' ORDER BY finished_at DESC, id DESC")]
    assert seen == expected and pages == 3


def test_running_tasks_page_most_recently_started_first(conn):
    conn.execute("""
        INSERT INTO tasks (id, name, task_type, status, claimed_by, lease_until, started_at)
        SELECT 'r-' || g, 'n', 't', 'RUNNING', 'w', now() + interval '1 minute',
               '2026-01-01 00:00Z'::timestamptz + (g % 4) * interval '1 second'
        FROM generate_series(1, 23) AS g""")
    seen, _ = _all_pages(Client(conn), ListFilter(status="RUNNING"), 4)
    assert seen == [row[0] for row in conn.execute(
        "SELECT id FROM tasks ORDER BY started_at DESC, id DESC")]


def test_a_unique_key_finds_the_live_task_holding_it(conn):
    client = Client(conn)
    client.submit("t", {}, task_id="holder", unique_key="invoice-7")
    page = client.browse(ListFilter(status="PENDING", unique_key="invoice-7"))
    assert [task["id"] for task in page.tasks] == ["holder"] and page.after is None
    assert client.browse(ListFilter(status="PENDING", unique_key="invoice-7",
                                    task_type="other")).tasks == []


@pytest.mark.parametrize("filters, after, fragment", [
    ({"status": "DONE"}, None, "unknown status"),
    ({"status": "PENDING", "task_type": "x" * 201}, None, "type: longer than"),
    ({"status": "PENDING", "error": "a\x00b"}, None, "error: must not contain NUL"),
    ({"status": "PENDING", "id_prefix": "a\nb"}, None, "id: must not contain control"),
    ({"status": "PENDING"}, "not base64 !", "after: not a page key"),
    ({"status": "FAILED"}, "WyJkdWUiLDEsIngiLCJ5IiwieiJd", "not a page key of a FAILED"),
    ({"status": "PENDING"}, "WyJkdWUiLDEsIngiLCJ5IiwieiJd", "a time that is not one"),
    ({"status": "PENDING"}, "WyJkdWUiXQ", "wrong shape"),
])
def test_a_bad_filter_or_key_is_refused_with_its_reason(conn, filters, after, fragment):
    client = Client(conn)
    with pytest.raises(UsageError, match=fragment):
        client.browse(ListFilter.checked(**filters), after=after)


def _rollup(conn) -> dict:
    return store.rollup_minutes(conn, cap=10_000, catch_up=10, max_types=200)


def test_the_rollup_counts_each_minutes_finished_tasks_once(conn, db_dsn):
    conn.execute("""
        INSERT INTO tasks (id, name, task_type, status, finished_at)
        SELECT 'f-' || g, 'n', 't' || (g % 2), CASE WHEN g % 3 = 0 THEN 'FAILED'
                                                    ELSE 'COMPLETED' END,
               date_trunc('minute', now()) - (1 + g % 4) * interval '1 minute'
                   + (g % 50) * interval '1 second'
        FROM generate_series(1, 300) AS g""")
    # Older than the catch-up window, and in the current minute: neither is rolled up now.
    conn.execute("""INSERT INTO tasks (id, name, task_type, status, finished_at) VALUES
        ('old', 'n', 't0', 'COMPLETED', date_trunc('minute', now()) - interval '20 minutes'),
        ('now', 'n', 't0', 'COMPLETED', now())""")
    conn.execute("""INSERT INTO tasks (id, name, task_type) SELECT 'p-' || g, 'n', 'q'
                    FROM generate_series(1, 17) AS g""")
    with psycopg.connect(db_dsn, autocommit=True) as other:
        # Two daemons at once: the second writes nothing the first did not.
        first, second = _rollup(conn), _rollup(other)
    assert first["minutes_written"] == 10 and second["minutes_written"] == 0
    rolled = {(row[0], row[1]): (row[2], row[3]) for row in conn.execute(
        "SELECT minute, task_type, completed, failed FROM pgtaskd_minute_rollup "
        "WHERE task_type <> '' AND completed + failed > 0")}
    truth = {(row[0], row[1]): (row[2], row[3]) for row in conn.execute(
        "SELECT date_trunc('minute', finished_at), task_type, "
        "count(*) FILTER (WHERE status = 'COMPLETED'), count(*) FILTER (WHERE status = 'FAILED') "
        "FROM tasks WHERE id NOT IN ('old', 'now') AND finished_at IS NOT NULL GROUP BY 1, 2")}
    assert rolled == truth
    whole = conn.execute(
        "SELECT due, running, completed FROM pgtaskd_minute_rollup WHERE task_type = '' "
        "ORDER BY minute DESC LIMIT 1").fetchone()
    assert whole[0] == 17 and whole[1] == 0
    assert conn.execute("SELECT count(*) FROM pgtaskd_minute_rollup WHERE task_type = '' "
                        "AND due IS NULL").fetchone()[0] == 9  # caught up, never sampled
    overview = {row["task_type"]: row for row in Client(conn).overview()}
    assert overview["t1"]["completed_1h"] == sum(c for (_, t), (c, _) in truth.items()
                                                 if t == "t1")
    assert overview["q"]["due"] == 17
