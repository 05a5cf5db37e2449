"""The claim, the reaper and the health check cost the same whatever else the table holds.

Each test fills the table with rows a query must not read (finished tasks, tasks due in the
future at a higher priority, RUNNING tasks under live leases, due tasks of types the worker
does not run), then four times as many, and counts the buffers the query touches each time.
Buffers, not time: a shared machine's timings prove nothing, but a query that reads rows one
by one reads pages in proportion, while a flat one reads the same few (a deeper B-tree adds a
page per lookup, no more). Every measured statement runs in a transaction that is rolled back,
twice (the first run also reads the catalog).
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import psycopg
import psycopg.sql
import pytest

from supervisor.db.queries import QUERIES

# A skew this large reads hundreds of pages when a query walks it row by row (20,000 index
# entries fill about 80 index pages and 300 heap pages); a flat query reads a handful more.
SKEW = 20_000
# What the first SKEW rows may add: one more B-tree level for each row the query looks up or
# writes (the pkey, the indexes of the new row versions), and the statistics' new plan.
LEVEL_MARGIN = 10
PER_ROW_MARGIN = 6
# What the next 3 x SKEW rows may add: again a B-tree level per row looked up or written at
# most, nothing in proportion to them (a walk over 60,000 more index entries reads 200 pages
# or more).
GROWTH_MARGIN = 10
PER_ROW_GROWTH = 4
# TABLESAMPLE SYSTEM keeps each page by chance: the health check's sample reads about 15
# pages of a table of these rows, give or take a few.
SAMPLE_PAGES_MARGIN = 15


def buffers(conn, name: str, params: dict, *, first: str | None = None) -> int:
    """Shared buffers (hit + read) touched by running the named query once (after the
    statement named ``first``, in its transaction, as the product runs them)."""
    total = None
    for _ in range(2):
        with conn.transaction(force_rollback=True):
            if first:
                conn.execute(QUERIES[first])
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[name],
                                params).fetchone()[0][0]
        total = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)
    return total


def claim_params(limit: int = 1, types=("echo",)) -> dict:
    return {"worker_id": "worker-a", "done_ids": [], "done_tokens": [], "done_cpu": [],
            "done_rss": [],
            "task_types": list(types), "lease_seconds": 30, "limit": limit}


def add_due(conn, count: int, task_type: str = "echo", priority: int = 0, prefix: str = "due"):
    conn.execute("INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
                 "SELECT %s || g, 'n', %s, %s, now() - g * interval '1 millisecond' "
                 "FROM generate_series(1, %s) g", (prefix, task_type, priority, count))


SKEWS = {
    "finished": "INSERT INTO tasks (id, name, task_type, status, finished_at) "
                "SELECT 'done' || g, 'n', 'echo', 'COMPLETED', now() "
                "FROM generate_series(%(from)s::int, %(n)s::int) g",
    # An hour ahead: a row that came within the staging lead while the test ran would be
    # staged by the claim, a write in proportion to the time passed, not to the skew.
    "future_higher_priority": "INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
                              "SELECT 'future' || g, 'n', 'echo', 5, "
                              "now() + interval '1 hour' + g * interval '1 s' "
                              "FROM generate_series(%(from)s::int, %(n)s::int) g",
    "running_live_leases": "INSERT INTO tasks (id, name, task_type, priority, status, claimed_by, "
                           "lease_until, lease_token) "
                           "SELECT 'running' || g, 'n', 'echo', 9, 'RUNNING', 'w', "
                           "now() + interval '1 hour', g FROM generate_series(%(from)s::int, %(n)s::int) g",
    "other_types_due": "INSERT INTO tasks (id, name, task_type, priority) "
                       "SELECT 'other' || g, 'n', 'other' || (g %% 20), 9 "
                       "FROM generate_series(%(from)s::int, %(n)s::int) g",
}


# Due rows, at a higher priority than the work a claim may take, of a type the test pauses
# (or whose limit it fills):
# kept apart from SKEWS, whose every entry the tests above run against an unpaused claim.
PAUSED_SKEWS = {
    "paused_type_due": "INSERT INTO tasks (id, name, task_type, priority) "
                       "SELECT 'paused' || g, 'n', 'paused', 9 "
                       "FROM generate_series(%(from)s::int, %(n)s::int) g",
    # The same, of a type whose global limit is full.
    "full_limited_type_due": "INSERT INTO tasks (id, name, task_type, priority) "
                             "SELECT 'limited' || g, 'n', 'limited', 9 "
                             "FROM generate_series(%(from)s::int, %(n)s::int) g",
}


def skewed_buffers(conn, skew: str, name: str, params: dict) -> tuple[int, int, int]:
    """Buffers of the query on the table as it is, with SKEW rows of ``skew``, with 4 x SKEW."""
    insert = {**SKEWS, **PAUSED_SKEWS}[skew]
    conn.execute("ANALYZE tasks")
    flat = buffers(conn, name, params)
    conn.execute(insert, {"n": SKEW, "from": 1})
    conn.execute("ANALYZE tasks")
    once = buffers(conn, name, params)
    conn.execute(insert, {"n": 4 * SKEW, "from": SKEW + 1})
    conn.execute("ANALYZE tasks")
    four_times = buffers(conn, name, params)
    print(f"\n{name}: {flat} buffers on its own work, {once} with {SKEW:,} rows of {skew}, "
          f"{four_times} with {4 * SKEW:,}")
    return flat, once, four_times


def assert_flat(measured: tuple[int, int, int], rows_touched: int) -> None:
    flat, once, four_times = measured
    assert once <= flat + LEVEL_MARGIN + PER_ROW_MARGIN * rows_touched, measured
    assert four_times <= once + GROWTH_MARGIN + PER_ROW_GROWTH * rows_touched, measured


@pytest.mark.parametrize("skew", sorted(SKEWS))
@pytest.mark.parametrize("limit", [1, 10])
def test_the_claim_reads_no_more_on_a_skewed_table(conn, skew, limit):
    add_due(conn, 50)
    assert_flat(skewed_buffers(conn, skew, "complete_and_claim", claim_params(limit)), limit)


def test_the_claim_still_finds_due_work_below_a_future_priority_level(conn):
    """The skews above must not hide work either: the claim takes the due task of the highest
    priority that has any, however many future tasks sit above it."""
    conn.execute(SKEWS["future_higher_priority"], {"n": SKEW, "from": 1})
    add_due(conn, 3, priority=1, prefix="mid")
    add_due(conn, 3, priority=0, prefix="low")
    row = conn.execute(QUERIES["complete_and_claim"], claim_params(limit=4)).fetchall()
    claimed = sorted((r[12], r[1]) for r in row if not r[0])
    assert [task_id for _, task_id in claimed] == ["mid3", "mid2", "mid1", "low3"]


# What the workers' claim does, as they run it: a generic plan, prepared once per connection,
# on a table whose statistics describe the skew (so a plan that flips with them shows).
GENERIC_SKEWS = [
    # 14.7: a due backlog below a mass of future work at a higher priority. The generic plan
    # read the due rows through the due-time index, filtering out each one (16-18 ms).
    ("future rows above a due backlog",
     "INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
     "SELECT 'ahead' || g, 'n', 'echo', 10, now() + interval '1 day' + g * interval '1 ms' "
     "FROM generate_series(1, 200000) g"),
    # 14.7, 15.9: each future task at a priority of its own. The level walk probed every
    # level, due or not (5,000 levels: 54 ms; 300,000: 2.6 s).
    ("future priority levels",
     "INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
     "SELECT 'level' || g, 'n', 'echo', 100 + g, now() + interval '1 day' "
     "FROM generate_series(1, 5000) g"),
    ("live leases", "INSERT INTO tasks (id, name, task_type, priority, status, claimed_by, "
                    "lease_until, lease_token) SELECT 'running' || g, 'n', 'echo', 9, "
                    "'RUNNING', 'w', now() + interval '1 hour', g "
                    "FROM generate_series(1, 50000) g"),
    ("other types due", "INSERT INTO tasks (id, name, task_type, priority) "
                        "SELECT 'other' || g, 'n', 'other' || (g % 20), 9 "
                        "FROM generate_series(1, 50000) g"),
    ("finished", "INSERT INTO tasks (id, name, task_type, status, finished_at) "
                 "SELECT 'done' || g, 'n', 'echo', 'COMPLETED', now() "
                 "FROM generate_series(1, 100000) g"),
]
# One more priority level visited, or a page of the due rows it locks and skips, at most.
ROWS_MARGIN = 6


def executor_rows(conn, params: dict, name: str = "complete_and_claim") -> int:
    """Rows every node of the generic plan of the claim produced or filtered out,
    over all its loops: what the executor did, whatever the machine's speed. Prepared anew,
    so that the plan follows the statistics of the moment."""
    names: list[str] = []

    def placeholder(match):
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    text = re.sub(r"%\((\w+)\)s", placeholder, QUERIES[name]).replace("%%", "%")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute("DEALLOCATE ALL")
    conn.execute("PREPARE claim AS " + text)
    arguments = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(params[n]) for n in names)
    total = 0
    for _ in range(2):
        with conn.transaction(force_rollback=True):
            plan = conn.execute(psycopg.sql.SQL(
                "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) EXECUTE claim ({})").format(
                    arguments)).fetchone()[0][0]["Plan"]
        total = _rows(plan)
    return total


def _rows(node: dict) -> int:
    loops = node.get("Actual Loops", 1)
    own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
           + node.get("Rows Removed by Index Recheck", 0)) * loops
    return own + sum(_rows(child) for child in node.get("Plans", ()))


@pytest.mark.parametrize("limit", [1, 10])
def test_the_workers_claim_does_no_more_work_on_a_skewed_table(conn, limit):
    """14.7, 15.9: bounded by what the executor does against the same table without the
    skews, measured in this test: flat means no row more than one more level costs, with
    each skew added in turn and its statistics gathered."""
    add_due(conn, 20_000)
    conn.execute("ANALYZE tasks")
    params = claim_params(limit)
    baseline = executor_rows(conn, params)
    for name, insert in GENERIC_SKEWS:
        conn.execute(insert)
        conn.execute("ANALYZE tasks")
        measured = executor_rows(conn, params)
        print(f"\nclaim of {limit}: {baseline} rows on its own work, {measured} with {name}")
        assert measured <= baseline + ROWS_MARGIN, (name, baseline, measured)
    claimed = [r for r in conn.execute(QUERIES["complete_and_claim"], params).fetchall()
               if r[0] is False]
    assert len(claimed) == limit and all(r[1].startswith("due") for r in claimed)


@pytest.mark.parametrize("name", ["complete_and_claim", "complete_and_claim_limited"])
def test_the_workers_claim_reads_no_older_backlog_below_a_newer_level(conn, name):
    """A due backlog at priority 0, then a few newer due tasks at priority 5, on a table
    whose statistics (50,000 live leases at 9) made the generic plan read a level's rows
    through the due-time index: in time order, every row of the older backlog before the
    level's own (20,046 rows for a claim of one). Claims of one and of ten, on one fill."""
    add_due(conn, 20_000)
    conn.execute(SKEWS["running_live_leases"], {"n": 50_000, "from": 1})
    conn.execute("ANALYZE tasks")
    params = {limit: claim_params(limit) for limit in (1, 10)}
    baseline = {limit: executor_rows(conn, params[limit], name) for limit in params}
    add_due(conn, 10, priority=5, prefix="newer")
    conn.execute("ANALYZE tasks")
    for limit in params:
        measured = executor_rows(conn, params[limit], name)
        print(f"\n{name} of {limit}: {baseline[limit]} rows on the backlog, {measured} with a "
              f"newer level")
        assert measured <= baseline[limit] + ROWS_MARGIN, (limit, baseline[limit], measured)
    claimed = [r for r in conn.execute(QUERIES[name], params[10]).fetchall() if r[0] is False]
    assert len(claimed) == 10 and all(r[1].startswith("newer") for r in claimed)


@pytest.mark.parametrize("limit", [1, 10])
def test_the_claim_never_reads_the_due_rows_of_a_paused_type(conn, limit):
    """The paused type's rows outrank the work the claim takes, so a claim that read them, or
    locked and skipped them, would read them all; its type is dropped before the index is
    probed instead."""
    conn.execute("INSERT INTO task_type_pauses (task_type) VALUES ('paused')")
    add_due(conn, 50)
    params = claim_params(limit, types=("echo", "paused"))
    assert_flat(skewed_buffers(conn, "paused_type_due", "complete_and_claim", params), limit)
    claimed = conn.execute(QUERIES["complete_and_claim"], params).fetchall()
    assert len(claimed) == limit and {r[3] for r in claimed} == {"echo"}


@pytest.mark.parametrize("skew", ["finished", "future_higher_priority", "running_live_leases"])
def test_the_reaper_reads_no_more_with_live_leases_and_finished_rows(conn, skew):
    params = {"batch_size": 100, "base_delay": 0.0, "max_delay": 0.0, "jitter": 0.0}
    conn.execute("INSERT INTO tasks (id, name, task_type, status, claimed_by, lease_until, "
                 "lease_token) SELECT 'expired' || g, 'n', 'echo', 'RUNNING', 'w', "
                 "now() - interval '1 minute', -g FROM generate_series(1, 5) g")
    assert_flat(skewed_buffers(conn, skew, "reap_expired_leases", params), 5)


@pytest.mark.parametrize("skew", ["finished", "future_higher_priority", "running_live_leases"])
def test_the_health_check_reads_no_more_with_future_running_and_finished_rows(conn, skew):
    add_due(conn, 50)
    assert_flat(skewed_buffers(conn, skew, "queue_health",
                               {"max_pending_age": 300.0, "lease_grace": 15.0,
                                "cap": 10_000, "types": None}), 0)


def test_live_counts_are_exact_for_live_tasks_and_estimated_for_a_large_finished_history(conn):
    from supervisor.db import store

    add_due(conn, 30)
    conn.execute(SKEWS["running_live_leases"], {"n": 20, "from": 1})
    conn.execute("INSERT INTO tasks (id, name, task_type, status, finished_at) "
                 "SELECT 'f' || g, 'n', 'echo', CASE WHEN g % 10 = 0 THEN 'FAILED' "
                 "ELSE 'COMPLETED' END, now() FROM generate_series(1, 250000) g")
    counts, not_exact, _ = store.live_counts(conn)
    assert not not_exact, "before ANALYZE the statistics know nothing: count exactly"
    assert counts == {"PENDING": 30, "RUNNING": 20, "COMPLETED": 225_000, "FAILED": 25_000,
                      "CANCELLED": 0}
    conn.execute("ANALYZE tasks")
    counts, not_exact, _ = store.live_counts(conn)
    assert not_exact == dict.fromkeys(["COMPLETED", "FAILED", "CANCELLED"], "estimate")
    assert (counts["PENDING"], counts["RUNNING"]) == (30, 20), "live tasks are always exact"
    assert abs(counts["COMPLETED"] - 225_000) < 22_500 and abs(counts["FAILED"] - 25_000) < 5_000
    read = buffers(conn, "live_counts", {"cap": 10_000})
    pages = conn.execute("SELECT pg_relation_size('tasks') / 8192").fetchone()[0]
    # The statistics views cost a fixed hundred buffers or so; a count reads every page.
    assert read < 200 < pages / 10, f"the live counts read {read} buffers of {pages} pages"


def test_a_task_due_since_minus_infinity_does_not_break_the_health_check(conn):
    from supervisor.db import store

    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "VALUES ('forever', 'n', 'echo', '-infinity'), ('now', 'n', 'echo', now())")
    health = store.queue_health(conn, max_pending_age=300, lease_grace=15)
    assert health["due_pending"] == 2 and health["old_pending"] == 1
    assert health["oldest_pending_age"] is not None


def test_the_workers_connections_plan_the_claim_once_and_never_compile_it(db_dsn):
    """The claim is prepared with a generic plan, whose estimates on a table of millions of
    rows pass jit_above_cost: with JIT on, compiling it took 21 ms a call (5,000,000 finished
    rows, PostgreSQL 15) where running it took 0.5 ms."""
    from supervisor.worker.pools import open_pool

    pool = open_pool(db_dsn, connect_timeout=5, name="pgtaskd test#1")
    pool.open(wait=True, timeout=10)
    try:
        with pool.connection() as conn:
            assert conn.execute("SHOW jit").fetchone()[0] == "off"
            assert conn.execute("SHOW plan_cache_mode").fetchone()[0] == "force_generic_plan"
    finally:
        pool.close()
    handlers = open_pool(db_dsn, connect_timeout=5, name="handlers", generic_plans=False)
    handlers.open(wait=True, timeout=10)
    try:
        with handlers.connection() as conn:
            assert conn.execute("SHOW plan_cache_mode").fetchone()[0] == "auto", \
                "a handler's own queries keep PostgreSQL's defaults"
    finally:
        handlers.close()


@pytest.mark.parametrize("limit", [1, 10])
def test_the_claim_never_reads_the_due_rows_of_a_type_whose_limit_is_full(conn, limit):
    conn.execute("INSERT INTO task_type_limits (task_type, max_running) VALUES ('limited', 1)")
    conn.execute("INSERT INTO task_type_slots (task_type, slot, task_id, lease_token, "
                 "lease_until) VALUES ('limited', 1, 'holder', 1, now() + interval '1 hour')")
    add_due(conn, 50)
    params = claim_params(limit, types=("echo", "limited"))
    assert_flat(skewed_buffers(conn, "full_limited_type_due", "complete_and_claim_limited",
                               params), limit)
    claimed = [r for r in conn.execute(QUERIES["complete_and_claim_limited"], params).fetchall()
               if r[0] is False]
    assert len(claimed) == limit and {r[3] for r in claimed} == {"echo"}


@contextmanager
def recorded_statements():
    """Every statement this process sends while inside, with its parameters, whichever
    connection sends it: what a health check or a stats call costs is what it runs."""
    seen = []
    original = psycopg.Cursor.execute

    def execute(self, query, params=None, **kwargs):
        seen.append((query, params))
        return original(self, query, params, **kwargs)

    # A wrapper: every statement still runs on the real server, which answers it.
    psycopg.Cursor.execute = execute
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = original


def replayed_buffers(conn, statements) -> int:
    """Shared buffers the recorded queries touch, each replayed under EXPLAIN ANALYZE in a
    rolled-back transaction (twice, as in buffers())."""
    total = 0
    for query, params in statements:
        text = re.sub(r"^(\s*--[^\n]*\n)*", "", query if isinstance(query, str) else "")
        if not re.match(r"\s*(SELECT|WITH)\b", text, re.IGNORECASE):
            continue
        for _ in range(2):
            with conn.transaction(force_rollback=True):
                plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text,
                                    params).fetchone()[0][0]
        total += plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)
    return total


def cost_of(conn, call) -> tuple[int, object]:
    with recorded_statements() as statements:
        result = call()
    assert statements, "the call ran no statement"
    return replayed_buffers(conn, statements), result


BACKLOGS = {
    "due": "INSERT INTO tasks (id, name, task_type, scheduled_time) "
           "SELECT 'backlog' || g, 'n', 'echo', now() - g * interval '1 millisecond' "
           "FROM generate_series(%(from)s::int, %(n)s::int) g",
    "future": SKEWS["future_higher_priority"],
}


@pytest.mark.parametrize("backlog", sorted(BACKLOGS))
def test_the_health_check_reads_no_more_with_a_large_pending_backlog(db_dsn, conn, backlog,
                                                                      monkeypatch):
    """14.8: with 1.22M PENDING tasks every daemon's check counted all of them (due and
    future) every 5 s, 226 ms each. Past a cap, the counts stop and the statistics estimate."""
    from supervisor.maintenance.health import ChildrenStatus, HealthChecker
    from supervisor.maintenance.http import QueueCollector

    from supervisor.maintenance import health

    # Every check takes the per-type figures, whatever the last one cost: their reads count.
    monkeypatch.setattr(health, "BY_TYPE_EVERY", 0.0)
    checker = HealthChecker(db_dsn, interval=5, max_pending_age=300, lease_grace=15,
                            children=lambda: ChildrenStatus(1, 1), known_types={"echo", "idle"})
    try:
        add_due(conn, 50)
        measured = []
        for size, start in [(SKEW, 1), (4 * SKEW, SKEW + 1)]:
            conn.execute(BACKLOGS[backlog], {"n": size, "from": start})
            conn.execute("ANALYZE tasks")
            read, report = cost_of(conn, checker.run_once)
            measured.append(read)
        print(f"\nhealth check: {measured[0]} buffers with {SKEW:,} {backlog} tasks, "
              f"{measured[1]} with {4 * SKEW:,}")
        # The per-type split samples pages at random (about 2,000 rows' worth whatever the
        # table holds): how many it picks varies from one check to the next by a few.
        assert measured[1] <= measured[0] + GROWTH_MARGIN + SAMPLE_PAGES_MARGIN, measured
        body = report.as_json()
        assert report.database_ok
        assert body["not_exact"]["tasks_by_status.PENDING"] == "estimate"
        assert abs(body["tasks_by_status"]["PENDING"] - (4 * SKEW + 50)) < 0.2 * 4 * SKEW
        assert body["tasks_by_status"]["RUNNING"] == 0 and "tasks_by_status.RUNNING" \
            not in body["not_exact"]
        gauges = {family.name: family for family in QueueCollector(checker).collect()}
        estimated = {(sample.labels["status"], sample.labels["task_type"]): sample.value
                     for sample in gauges["pgtaskd_tasks_estimated"].samples}
        assert (estimated["PENDING", "echo"], estimated["RUNNING", "echo"]) == (1, 0)
        assert (estimated["PENDING", "idle"], estimated["PENDING", "_other"]) == (0, 0)
        # 18.6: the estimated total goes to the one type that holds the backlog, by a sample.
        by_type = report.by_type
        assert by_type["echo"].not_exact == {"pending": "estimate"}
        assert abs(by_type["echo"].pending - (4 * SKEW + 50)) < 0.2 * 4 * SKEW
        assert (by_type["idle"].pending, by_type["_other"].pending) == (0, 0)
    finally:
        checker._close()


def test_stats_reads_no_more_on_a_large_table(db_dsn, conn, monkeypatch):
    """14.8: `pgtaskd stats` counted by type and status with a sequential scan (1.44 s on
    6.27M rows). On a large table (here made large by lowering the bar) it samples."""
    from supervisor import Client
    from supervisor.db import queue_figures

    monkeypatch.setattr(queue_figures, "EXACT_COUNT_BELOW", 5_000)
    monkeypatch.setattr(queue_figures, "SAMPLE_ROWS", 1_000)
    add_due(conn, 50)
    conn.execute(SKEWS["running_live_leases"], {"n": 20, "from": 1})
    measured = []
    with Client(db_dsn) as client:
        for size, start in [(SKEW, 1), (4 * SKEW, SKEW + 1)]:
            conn.execute(SKEWS["finished"], {"n": size, "from": start})
            conn.execute("ANALYZE tasks")
            read, stats = cost_of(conn, client.stats)
            measured.append(read)
    print(f"\nstats: {measured[0]} buffers with {SKEW:,} finished tasks, {measured[1]} with "
          f"{4 * SKEW:,}")
    assert measured[1] <= measured[0] + GROWTH_MARGIN + 20, measured
    assert stats["by_status"]["PENDING"] == 50 and stats["by_status"]["RUNNING"] == 20
    assert abs(stats["by_status"]["COMPLETED"] - 4 * SKEW) < 0.2 * 4 * SKEW
    assert stats["by_type"]["echo"]["RUNNING"] == 20
    assert stats["not_exact"] == {"total": "estimate", "by_type": "estimate",
                                  "by_status.COMPLETED": "estimate",
                                  "by_status.FAILED": "estimate",
                                  "by_status.CANCELLED": "estimate"}
