"""The queue gauges by task type (18.6): each type the daemon's configs name gets its own
figures, every other type one shared series, at a cost no row can raise.

Real PostgreSQL; the figures are checked against what the test wrote, and the cost in
buffers as tests/integration/test_claim_cost.py measures it.
"""

from __future__ import annotations

import pytest

from supervisor.db import queue_figures, store
from supervisor.db.queue_figures import AT_LEAST, ESTIMATE, OTHER_TYPES

from conftest import wait_until
from test_claim_cost import GROWTH_MARGIN, SKEW, SKEWS, buffers


def due(conn, count: int, task_type: str, *, ago: str = "1 minute", prefix: str | None = None,
        priority: int = 0) -> None:
    conn.execute("INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
                 "SELECT %s || g, 'n', %s, %s, now() - %s::interval "
                 "FROM generate_series(1, %s) g",
                 (prefix or task_type, task_type, priority, ago, count))


def figures(conn, known, cap=1_000):
    return store.queue_by_type(conn, known, cap=cap, live=store.live_counts(conn, cap=cap))


def test_known_types_have_their_own_figures_and_every_other_type_shares_one(conn):
    due(conn, 3, "echo", ago="10 minutes")
    due(conn, 2, "echo", ago="1 minute", prefix="echo-late", priority=5)
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "VALUES ('later', 'n', 'echo', now() + interval '1 hour')")
    conn.execute("INSERT INTO tasks (id, name, task_type, status, claimed_by, lease_until, "
                 "lease_token) VALUES ('r1', 'n', 'echo', 'RUNNING', 'w', now() + interval "
                 "'1 hour', 1), ('r2', 'n', 'stranger', 'RUNNING', 'w', now() + interval "
                 "'1 hour', 2)")
    # Hostile rows: a thousand types no config names, one task each.
    conn.execute("INSERT INTO tasks (id, name, task_type, scheduled_time) "
                 "SELECT 'junk' || g, 'n', 'junk' || g, now() - interval '30 minutes' "
                 "FROM generate_series(1, 1000) g")
    got = figures(conn, {"echo", "idle"})
    assert set(got) == {"echo", "idle", OTHER_TYPES}, "one series for every other type"
    assert (got["echo"].pending, got["echo"].running) == (6, 1)
    assert 600 <= got["echo"].oldest_due_age < 660, "the oldest of every priority level"
    assert got["echo"].not_exact == {}
    assert (got["idle"].pending, got["idle"].running, got["idle"].oldest_due_age) == (0, 0, None)
    other = got[OTHER_TYPES]
    assert (other.pending, other.running) == (1000, 1)
    assert 1800 <= other.oldest_due_age < 1860
    # 1,000 other types: the age was looked for in the first 20 only, a lower bound then.
    assert other.not_exact == {"oldest_due_age": AT_LEAST}


def test_the_other_types_oldest_is_exact_when_few_and_counts_stop_at_the_cap(conn):
    due(conn, 30, "echo")
    due(conn, 3, "b-other", ago="2 hours")
    due(conn, 3, "z-other", ago="3 hours")
    got = figures(conn, {"echo", "m-known"}, cap=10)
    assert got["echo"].pending == 11 and got["echo"].not_exact == {"pending": AT_LEAST}, \
        "past the cap, at least cap + 1 (no statistics: no estimate)"
    other = got[OTHER_TYPES]
    assert other.pending == 6 and other.not_exact == {}, "the gaps before and after m-known"
    assert 3 * 3600 <= other.oldest_due_age < 3 * 3600 + 60


def test_a_capped_count_is_split_from_the_estimated_total_by_a_sample(conn, monkeypatch):
    monkeypatch.setattr(queue_figures, "HEALTH_SAMPLE_ROWS", 20_000)  # the whole table
    due(conn, 9_000, "echo")
    due(conn, 3_000, "mail")
    due(conn, 5, "junk")
    conn.execute("ANALYZE tasks")
    got = figures(conn, {"echo", "mail"}, cap=1_000)
    assert got["echo"].not_exact == got["mail"].not_exact == {"pending": ESTIMATE}
    assert abs(got["echo"].pending - 9_000) < 900 and abs(got["mail"].pending - 3_000) < 300
    assert got[OTHER_TYPES].pending == 5 and got[OTHER_TYPES].not_exact == {}


def test_a_config_type_named_like_the_fold_shares_its_series(conn):
    due(conn, 2, OTHER_TYPES)
    due(conn, 3, "stranger")
    got = figures(conn, {OTHER_TYPES})
    assert set(got) == {OTHER_TYPES} and got[OTHER_TYPES].pending == 5


TYPE_SKEWS = {
    # Due tasks of a new type each: a per-type series each would be the table's to choose.
    "many_other_types_due": "INSERT INTO tasks (id, name, task_type) "
                            "SELECT 'junk' || g, 'n', 'junk' || g "
                            "FROM generate_series(%(from)s::int, %(n)s::int) g",
    "known_type_future": "INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
                         "SELECT 'future' || g, 'n', 'idle', 5, "
                         "now() + interval '1 hour' + g * interval '1 s' "
                         "FROM generate_series(%(from)s::int, %(n)s::int) g",
}


# Not RUNNING rows: they are counted one by one, as live_counts does, being bounded by the
# workers.
@pytest.mark.parametrize("skew", ["finished", "other_types_due", "future_higher_priority",
                                  *TYPE_SKEWS])
def test_the_figures_by_type_read_no_more_however_the_table_grows(conn, skew):
    """A count reads up to cap + 1 index entries, so the first rows of a skew may cost up to
    that; four times as many must cost no more. Vacuumed as autovacuum would, so that an
    index-only scan reads no table page (without it, each of the cap + 1 entries may cost
    one: bounded by the cap still, but scattered by the skew's order)."""
    due(conn, 50, "echo")
    params = {"types": ["echo", "idle", "mail"], "cap": 1_000,
              "max_levels": queue_figures.MAX_LEVELS, "max_other": queue_figures.MAX_OTHER_TYPES}
    insert = {**SKEWS, **TYPE_SKEWS}[skew]
    measured = []
    for size, start in [(SKEW, 1), (4 * SKEW, SKEW + 1)]:
        conn.execute(insert, {"n": size, "from": start})
        conn.execute("VACUUM ANALYZE tasks")
        measured.append(buffers(conn, "queue_by_type", params, first="queue_by_type_plan"))
    print(f"\nqueue_by_type: {measured[0]} buffers with {SKEW:,} rows of {skew}, "
          f"{measured[1]} with {4 * SKEW:,}")
    # A deeper B-tree adds a page to each lookup: the other types' are a few per type.
    lookups = 5 * queue_figures.MAX_OTHER_TYPES if skew == "many_other_types_due" else 0
    assert measured[1] <= measured[0] + GROWTH_MARGIN + lookups, measured
    # Four counts (three types, the gaps of the others) of 1,001 index entries at most, and
    # a few probes for each of at most 20 other types: a few hundred pages where the
    # visibility map lets the scans skip the heap (PostgreSQL 15 here: at most 345), up to
    # one heap page per counted entry where it does not (PostgreSQL 16, the embedded
    # server: 1,603 for 20,000 rows of 20 other types, 753 for 80,000), whatever the size.
    assert measured[0] < 400 + 2 * 1_001, measured


def test_costly_figures_are_taken_again_only_after_a_while_or_for_new_types(db_dsn, conn,
                                                                            monkeypatch):
    """Where the figures cost more than BY_TYPE_CHEAP, the health check keeps them for
    BY_TYPE_EVERY (a million PENDING tasks: about 15 ms of a 20 ms check); a reload that
    changes the named types takes them at once. Here every check counts as costly."""
    from supervisor.maintenance import health
    from supervisor.maintenance.health import ChildrenStatus, HealthChecker

    monkeypatch.setattr(health, "BY_TYPE_CHEAP", -1.0)
    monkeypatch.setattr(health, "BY_TYPE_EVERY", 3.0)
    checker = HealthChecker(db_dsn, interval=5, max_pending_age=300, lease_grace=15,
                            children=lambda: ChildrenStatus(1, 1), known_types={"echo"})
    try:
        due(conn, 2, "echo")
        assert checker.run_once().by_type["echo"].pending == 2
        due(conn, 3, "echo", prefix="more")
        assert checker.run_once().by_type["echo"].pending == 2, "kept, not taken again"
        checker.known_types = frozenset({"echo", "idle"})
        assert checker.run_once().by_type["echo"].pending == 5, "new types: taken at once"
        due(conn, 1, "echo", prefix="last")
        wait_until(lambda: checker.run_once().by_type["echo"].pending == 6, timeout=10,
                   message="the figures to be taken again once due")
    finally:
        checker._close()
