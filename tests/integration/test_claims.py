"""The atomic claim: one owner per task, however many claimers race for it."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest

from supervisor.config import RetryConfig
from supervisor.db import store
from worker_fixtures import add_task, task_row

CLAIMERS = 16


def claim(conn, worker_id: str, types=("echo",), lease_seconds: float = 30):
    return store.claim_task(conn, worker_id=worker_id, task_types=types,
                            lease_seconds=lease_seconds)


def test_claim_makes_the_claimer_owner_with_a_lease_and_a_token(conn):
    add_task(conn, "t1")
    row = claim(conn, "worker-a", lease_seconds=30)
    assert row["id"] == "t1"
    stored = task_row(conn, "t1")
    assert stored["status"] == "RUNNING"
    assert stored["claimed_by"] == "worker-a"
    assert stored["lease_token"] == row["lease_token"] is not None
    assert stored["attempts"] == 1
    assert stored["started_at"] is not None
    lease_left = conn.execute("SELECT extract(epoch FROM lease_until - now()) FROM tasks "
                              "WHERE id = 't1'").fetchone()[0]
    assert 25 < lease_left <= 30


def test_claim_finds_nothing_when_no_task_is_pending(conn):
    add_task(conn, "done")
    row = claim(conn, "worker-a")
    assert store.complete_task(conn, store.Claim("done", "worker-a", row["lease_token"]))
    assert claim(conn, "worker-a") is None


def test_a_claimed_task_with_a_live_lease_has_one_owner(conn):
    add_task(conn, "t1")
    first = claim(conn, "worker-a")
    assert claim(conn, "worker-b") is None
    assert claim(conn, "worker-a") is None, "the owner itself must not claim its task twice"
    stored = task_row(conn, "t1")
    assert (stored["claimed_by"], stored["lease_token"]) == ("worker-a", first["lease_token"])


def _race(db_dsn, rounds: int, body) -> list:
    """Run ``body(conn, worker_id, round)`` in CLAIMERS threads that start each round together."""
    barrier = threading.Barrier(CLAIMERS)
    results: list = []
    errors: list = []
    lock = threading.Lock()

    def claimer(number: int) -> None:
        worker_id = f"worker-{number}"
        try:
            with psycopg.connect(db_dsn, autocommit=True) as connection:
                for round_number in range(rounds):
                    barrier.wait(timeout=30)
                    value = body(connection, worker_id, round_number)
                    with lock:
                        results.append((round_number, worker_id, value))
        except BaseException as exc:  # surfaced in the main thread below
            barrier.abort()
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_claimers_racing_for_one_task_leave_exactly_one_winner(conn, db_dsn):
    rounds = 25
    # One task per round, each of its own type, so every claimer of a round wants the same row.
    for round_number in range(rounds):
        add_task(conn, f"r{round_number}", task_type=f"type{round_number}")

    results = _race(db_dsn, rounds,
                    lambda c, worker_id, r: claim(c, worker_id, types=(f"type{r}",)))

    for round_number in range(rounds):
        winners = [(w, row) for r, w, row in results if r == round_number and row is not None]
        assert len(winners) == 1, f"round {round_number}: {len(winners)} claimers won"
        worker_id, row = winners[0]
        stored = task_row(conn, f"r{round_number}")
        assert stored["claimed_by"] == worker_id
        assert stored["lease_token"] == row["lease_token"]
        assert stored["attempts"] == 1


def test_concurrent_claimers_split_the_tasks_without_duplicates(conn, db_dsn):
    total = 600
    conn.execute("INSERT INTO tasks (id, name, task_type, payload) "
                 "SELECT 't' || g, 'n', 'echo', '{}' FROM generate_series(1, %s) g", (total,))

    def claim_all(c, worker_id, _round):
        rows = []
        while (row := claim(c, worker_id)) is not None:
            rows.append(row)
        return rows

    results = _race(db_dsn, 1, claim_all)

    claimed = [(worker_id, row) for _, worker_id, rows in results for row in rows]
    ids = [row["id"] for _, row in claimed]
    assert len(ids) == len(set(ids)) == total, "a task was claimed twice or not at all"
    assert len({row["lease_token"] for _, row in claimed}) == total
    assert len({worker_id for worker_id, _ in claimed}) > 1, "the race had a single claimer"
    owners = dict(conn.execute("SELECT id, claimed_by FROM tasks").fetchall())
    assert owners == {row["id"]: worker_id for worker_id, row in claimed}


def test_concurrent_batch_claimers_split_the_tasks_without_duplicates(conn, db_dsn):
    total = 1000
    conn.execute("INSERT INTO tasks (id, name, task_type, payload, priority) "
                 "SELECT 't' || g, 'n', CASE WHEN g %% 2 = 0 THEN 'echo' ELSE 'fail' END, '{}', "
                 "g %% 3 FROM generate_series(1, %s) g", (total,))

    def claim_all(c, worker_id, _round):
        batches = []
        while rows := store.claim_tasks(c, worker_id=worker_id, task_types=["echo", "fail"],
                                        lease_seconds=30, limit=7):
            batches.append(rows)
        return batches

    results = _race(db_dsn, 1, claim_all)

    rows = [row for _, _, batches in results for batch in batches for row in batch]
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)) == total, "a task was claimed twice or not at all"
    assert len({row["lease_token"] for row in rows}) == total
    for _, _, batches in results:
        for batch in batches:
            assert len(batch) <= 7
            order = [(-row["priority"], row["scheduled_time"], row["created_at"]) for row in batch]
            assert order == sorted(order), "a batch is not in the order its tasks should run"


def test_a_batch_takes_the_most_urgent_tasks_across_types_and_levels(conn):
    for task_id, task_type, priority in [("low-echo", "echo", 0), ("high-fail", "fail", 5),
                                         ("mid-echo", "echo", 3), ("other", "mystery", 9),
                                         ("mid-fail", "fail", 3)]:
        add_task(conn, task_id, task_type, priority=priority)
    rows = store.claim_tasks(conn, worker_id="worker-a", task_types=["echo", "fail"],
                             lease_seconds=30, limit=4)
    assert [row["id"] for row in rows][:1] == ["high-fail"]
    assert {row["id"] for row in rows[1:3]} == {"mid-echo", "mid-fail"}
    assert [row["id"] for row in rows][3:] == ["low-echo"]
    assert task_row(conn, "other")["status"] == "PENDING"


def test_completions_and_the_next_claim_commit_together_or_not_at_all(conn):
    add_task(conn, "t1")
    add_task(conn, "t2")
    first = store.claim_tasks(conn, worker_id="w", task_types=["echo"], lease_seconds=30)[0]
    done = [store.Claim("t1", "w", first["lease_token"])]
    with pytest.raises(psycopg.errors.DivisionByZero):
        with conn.transaction():
            store.complete_and_claim(conn, done, worker_id="w", task_types=["echo"],
                                     lease_seconds=30, limit=1)
            conn.execute("SELECT 1 / 0")
    assert (task_row(conn, "t1")["status"], task_row(conn, "t2")["status"]) == \
        ("RUNNING", "PENDING")
    landed, rows = store.complete_and_claim(conn, done, worker_id="w", task_types=["echo"],
                                            lease_seconds=30, limit=1)
    assert landed == {first["lease_token"]} and [row["id"] for row in rows] == ["t2"]
    assert (task_row(conn, "t1")["status"], task_row(conn, "t2")["status"]) == \
        ("COMPLETED", "RUNNING")
    # A completion of another worker's claim, or of a stale token, lands nowhere.
    assert store.complete_and_claim(conn, [store.Claim("t2", "intruder", rows[0]["lease_token"])],
                                    worker_id="intruder", task_types=[], lease_seconds=30,
                                    limit=0) == (set(), [])
    assert task_row(conn, "t2")["status"] == "RUNNING"


def test_claim_takes_only_due_tasks_of_the_given_types(conn):
    add_task(conn, "future", scheduled_time=_db_now(conn) + timedelta(hours=1))
    add_task(conn, "other-type", task_type="mystery")
    assert claim(conn, "worker-a") is None
    assert claim(conn, "worker-a", types=("echo", "mystery"))["id"] == "other-type"


def _db_now(conn):
    return conn.execute("SELECT now()").fetchone()[0]


INT_MAX, INT_MIN = 2**31 - 1, -2**31
NO_BACKOFF = RetryConfig(base_delay=0, max_delay=0, jitter=0)


@pytest.mark.parametrize("column, value", [
    ("attempts", INT_MAX), ("attempts", INT_MIN), ("retry_count", INT_MAX),
    ("max_retries", INT_MAX), ("priority", INT_MAX), ("priority", INT_MIN)])
def test_no_integer_a_client_can_store_aborts_the_statements_that_serve_other_tasks(
        conn, db_dsn, column, value):
    add_task(conn, "bad")
    add_task(conn, "good")
    conn.execute(f"UPDATE tasks SET {column} = %s WHERE id = 'bad'", (value,))

    def claimed_by(worker: str) -> dict[str, dict]:
        # A new connection's first claim runs complete_and_claim_limited, its next ones
        # (no limit binds echo) complete_and_claim: both statements are exercised.
        rows = store.claim_tasks(own, worker_id=worker, task_types=["echo"],
                                 lease_seconds=30, limit=5)
        return {row["id"]: row for row in rows}

    with psycopg.connect(db_dsn, autocommit=True) as own:
        first = claimed_by("w1")
        assert set(first) == {"bad", "good"}
        conn.execute("UPDATE tasks SET lease_until = now() - interval '1 second'")
        # The takeover of expired leases; bad's retries may be spent, left to the reaper.
        taken = claimed_by("w2")
        assert "good" in taken
        if "bad" in taken:
            assert store.fail_attempt(own, store.Claim("bad", "w2", taken["bad"]["lease_token"]),
                                      error="boom", permanent=False, retry=NO_BACKOFF)
            assert store.rescue_task(own, "good", taken["good"]["lease_token"],
                                     error="child died", retry=NO_BACKOFF)
        conn.execute("UPDATE tasks SET status = 'RUNNING', claimed_by = 'w3', "
                     "lease_until = now() - interval '1 second'")
        reaped = store.reap_expired_leases(own, batch_size=10, retry=NO_BACKOFF)
        assert {row["id"] for row in reaped} == {"bad", "good"}
        if column == "attempts" and value == INT_MAX:
            assert task_row(conn, "bad")["attempts"] == INT_MAX, "counting saturates"
