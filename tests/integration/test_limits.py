"""Global concurrency limits (migration 0007) at the SQL level: a claim takes a slot of its
type's limit in the same statement, concurrent claims never take more slots than there are,
every way out of a run gives its slot back, and a slot whose lease ran out is free again."""

from __future__ import annotations

import collections
import threading
from typing import Sequence

import psycopg
import pytest

from conftest import wait_until
from supervisor import Client
from supervisor.config import RetryConfig
from supervisor.db import store
from supervisor.errors import UsageError
from supervisor.lease_keeper import Held, LeaseKeeper
from worker_fixtures import add_task, received, task_row

pytest_plugins = ["worker_fixtures"]

NO_BACKOFF = RetryConfig(base_delay=0, max_delay=0, jitter=0)


@pytest.fixture
def client(db_dsn):
    with Client(db_dsn) as owned:
        yield owned


def claim(conn, *types: str, limit: int = 10, worker: str = "w", lease: float = 30,
          done=()) -> list[dict]:
    return store.complete_and_claim(conn, done, worker_id=worker, task_types=types,
                                    lease_seconds=lease, limit=limit)[1]


def ids(rows) -> list[str]:
    return [row["id"] for row in rows]


def held_slots(conn, task_type: str = "echo") -> list[str]:
    return [task_id for (task_id,) in conn.execute(
        "SELECT task_id FROM task_type_slots WHERE task_type = %s AND task_id IS NOT NULL "
        "AND lease_until > now() ORDER BY slot", (task_type,))]


def as_claim(row: dict, worker: str = "w") -> store.Claim:
    return store.Claim(row["id"], worker, row["lease_token"])


def test_a_claim_takes_no_more_than_the_free_slots_and_fills_up_with_other_types(client,
                                                                                 conn):
    client.set_limit("echo", 2)
    for n in range(5):
        add_task(conn, f"echo-{n}", "echo", priority=9)
    for n in range(3):
        add_task(conn, f"record-{n}", "record")
    rows = claim(conn, "echo", "record", limit=5)
    assert ids(rows) == ["echo-0", "echo-1", "record-0", "record-1", "record-2"]
    assert held_slots(conn) == ["echo-0", "echo-1"]
    assert {task_row(conn, t)["slot"] for t in ("echo-0", "echo-1")} == {1, 2}
    assert task_row(conn, "record-0")["slot"] is None
    # Full: the type is left out before its rows are read, the others still come.
    add_task(conn, "record-3", "record")
    assert ids(claim(conn, "echo", "record")) == ["record-3"]
    assert ids(claim(conn, "echo")) == []


def test_concurrent_claims_never_take_more_than_the_limit(client, db_dsn, conn):
    client.set_limit("echo", 3)
    for n in range(40):
        add_task(conn, f"t{n}")
    claimers = 8
    start = threading.Barrier(claimers)
    taken: list[str] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        with psycopg.connect(db_dsn, autocommit=True) as own:
            start.wait()
            for _ in range(20):
                rows = claim(own, "echo", limit=1 + n % 3, worker=f"w{n}")
                with lock:
                    taken.extend(ids(rows))

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(taken) == 3, taken
    running = conn.execute("SELECT count(*) FROM tasks WHERE status = 'RUNNING'").fetchone()[0]
    assert running == 3
    assert sorted(held_slots(conn)) == sorted(taken)


def test_a_completion_gives_its_slot_to_the_next_claim_in_the_same_statement(client, conn):
    client.set_limit("echo", 1)
    for n in range(3):
        add_task(conn, f"t{n}")
    (first,) = claim(conn, "echo")
    done, rows = store.complete_and_claim(conn, [as_claim(first)], worker_id="w",
                                          task_types=["echo"], lease_seconds=30, limit=5)
    assert done == {first["lease_token"]}
    assert ids(rows) == ["t1"]
    assert held_slots(conn) == ["t1"]
    # Completed while claiming only another type: the slot is freed, not kept.
    add_task(conn, "r0", "record")
    store.complete_and_claim(conn, [as_claim(rows[0])], worker_id="w", task_types=["record"],
                             lease_seconds=30, limit=5)
    assert held_slots(conn) == []
    assert ids(claim(conn, "echo")) == ["t2"]


@pytest.mark.parametrize("way_out", ["fail", "fail_permanently", "release", "rescue", "cancel"])
def test_every_end_of_a_run_gives_its_slot_back(client, conn, way_out):
    client.set_limit("echo", 1)
    add_task(conn, "t0")
    add_task(conn, "t1")
    (row,) = claim(conn, "echo")
    assert ids(claim(conn, "echo")) == []
    if way_out.startswith("fail"):
        store.fail_attempt(conn, as_claim(row), error="boom", permanent=way_out != "fail",
                           retry=NO_BACKOFF)
    elif way_out == "release":
        assert store.release_tasks(conn, [(row["id"], row["lease_token"])]) == {"t0"}
    elif way_out == "rescue":
        assert store.rescue_task(conn, "t0", row["lease_token"], error="child died",
                                 retry=NO_BACKOFF) is not None
    else:
        client.cancel("t0")
        # Its run is over once its owner says the handler stopped (or its lease runs out).
        store.end_lost_claims(conn, [("t0", row["lease_token"])])
    assert held_slots(conn) == []
    # The supervisor's next renewal, which had the claim in its list, takes nothing back.
    assert store.renew_leases(conn, [as_claim(row)], lease_seconds=30) == set()
    assert held_slots(conn) == []
    assert len(claim(conn, "echo")) == 1


@pytest.mark.parametrize("run_ends", ["owner_says_so", "lease_runs_out"])
def test_a_cancelled_run_keeps_its_slot_until_it_is_over(client, conn, run_ends):
    """Issue 14.5: a cancel gave a RUNNING task's slot back at once, while its handler ran
    on until its next is_cancelled() check, so the next task of the type started beside it
    (3 runs under a limit of 2 in the cancel storm). The claim ends with the cancel; its run
    ends when its owner says its handler stopped (end_lost_claims), or, if it never does,
    when the slot's lease runs out: no renewal extends it, no repair frees it before."""
    client.set_limit("echo", 1)
    add_task(conn, "t0", priority=1)
    add_task(conn, "t1")
    (row,) = claim(conn, "echo", lease=30 if run_ends == "owner_says_so" else 1.5)
    assert store.cancel_task(conn, "t0")
    assert ids(claim(conn, "echo", worker="other")) == []
    (lease_before,) = conn.execute("SELECT lease_until FROM task_type_slots").fetchone()
    assert store.renew_leases(conn, [as_claim(row)], lease_seconds=60) == set()
    assert conn.execute("SELECT lease_until FROM task_type_slots").fetchone()[0] == lease_before
    assert repair(conn) == {"freed": 0, "bounded": 0, "restored_held": 0, "restored_free": 0}
    assert held_slots(conn) == ["t0"]
    assert ids(claim(conn, "echo", worker="other")) == []
    if run_ends == "owner_says_so":
        # Said of a claim that still runs, it changes nothing: its final write ends it.
        client.set_limit("record", 1)
        add_task(conn, "r0", "record")
        (live,) = claim(conn, "record")
        states = store.end_lost_claims(conn, [("t0", row["lease_token"]),
                                              ("r0", live["lease_token"])])
        assert {t: state["status"] for t, state in states.items()} == \
            {"t0": "CANCELLED", "r0": "RUNNING"}
        assert held_slots(conn) == []
        assert held_slots(conn, "record") == ["r0"]
    else:
        wait_until(lambda: not held_slots(conn), timeout=5,
                   message="the cancelled claim's slot to end with its lease")
    assert ids(claim(conn, "echo", worker="other")) == ["t1"]
    assert repair(conn)["freed"] == 0


def test_a_cancelled_run_retried_and_claimed_again_gives_back_only_its_own_slot(client, conn):
    """An operator retries a cancelled task while its handler is still stopping, and it is
    claimed again in another slot: when the first run ends, its slot alone comes back."""
    client.set_limit("echo", 2)
    add_task(conn, "t0")
    (first,) = claim(conn, "echo")
    store.cancel_task(conn, "t0")
    client.retry("t0")
    (second,) = claim(conn, "echo", worker="other")
    assert held_slots(conn) == ["t0", "t0"]
    store.end_lost_claims(conn, [("t0", first["lease_token"])])
    assert conn.execute("SELECT lease_token FROM task_type_slots WHERE task_id IS NOT NULL"
                        ).fetchall() == [(second["lease_token"],)]


class Child:
    """A lease keeper's holder, as the supervisor's child is one: told what the keeper finds."""
    label = "child"

    def __init__(self):
        self.lost_reasons: list[str] = []

    def alive(self) -> bool:
        return True

    def renewed(self, tokens, expires_at) -> None:
        pass

    def lost(self, token, reason) -> None:
        self.lost_reasons.append(reason)


@pytest.mark.parametrize("settled_as", ["rescue", "complete", "release"])
@pytest.mark.parametrize("cancel_seen_by", ["renewal", "notification"])
def test_a_cancelled_claim_of_a_child_that_died_gives_its_slot_back_when_settled(
        client, conn, db_dsn, settled_as, cancel_seen_by):
    """The supervisor settles a dead child's claims (its cancel: kill, or any death) by what
    the child last wrote of each: a run it was in (rescue), one it finished (complete), one
    it never started (release). A claim cancelled before the death is none of those any
    more, and its slot, held for the run, must come back with the settling, not a lease
    later; also when the keeper's renewal saw the cancel first and stopped renewing it."""
    client.set_limit("echo", 1)
    add_task(conn, "t0")
    add_task(conn, "t1")
    (row,) = claim(conn, "echo")
    child = Child()
    keeper = LeaseKeeper(db_dsn, renew_interval=10, retry=NO_BACKOFF)
    held = Held("t0", row["lease_token"], "echo", "w", "default", holder=child,
                lease_seconds=30, renew_interval=10)
    keeper.hold([held])
    store.cancel_task(conn, "t0")
    try:
        if cancel_seen_by == "renewal":
            held.due = 0.0  # due now
            keeper.renew_due()
            assert child.lost_reasons == ["cancelled"]
        assert held_slots(conn) == ["t0"], "its handler may still run"
        keeper.settle(settled_as, keeper.drop_holder(child), "child died")
        keeper.settle_pending()
    finally:
        keeper._db.close()  # the thread, never started, would have
    assert held_slots(conn) == []
    assert ids(claim(conn, "echo", worker="other")) == ["t1"]
    assert task_row(conn, "t0")["status"] == "CANCELLED"


def test_a_renewal_extends_no_slot_of_a_claim_that_ended(client, conn):
    """Whatever ended the claim (here an operator's UPDATE, which frees no slot), a renewal
    keeps the slot only for a task still RUNNING under the claim's token."""
    client.set_limit("echo", 1)
    add_task(conn, "t0")
    (row,) = claim(conn, "echo", lease=5)
    conn.execute("UPDATE tasks SET status = 'COMPLETED', claimed_by = NULL WHERE id = 't0'")
    (before,) = conn.execute("SELECT lease_until FROM task_type_slots").fetchone()
    assert store.renew_leases(conn, [as_claim(row)], lease_seconds=30) == set()
    assert conn.execute("SELECT lease_until FROM task_type_slots").fetchone()[0] == before


def _end(conn, way_out: str, row: dict, more: Sequence[dict] = ()) -> None:
    """End the claim of ``row`` (and of ``more``, where the way out ends a batch)."""
    claim_ = as_claim(row)
    batch = [claim_, *(as_claim(other) for other in more)]
    if way_out == "complete":
        store.complete_tasks(conn, batch)
    elif way_out == "complete_and_claim":
        store.complete_and_claim(conn, batch, worker_id="w", task_types=["record"],
                                 lease_seconds=30, limit=1)
    elif way_out == "fail":
        store.fail_attempt(conn, claim_, error="boom", permanent=False, retry=NO_BACKOFF)
    elif way_out == "release":
        store.release_tasks(conn, [(c.task_id, c.token) for c in batch])
    elif way_out == "rescue":
        store.rescue_task(conn, row["id"], row["lease_token"], error="died", retry=NO_BACKOFF)
    else:
        store.cancel_task(conn, row["id"])
        store.end_lost_claims(conn, [(row["id"], row["lease_token"])])


def test_an_end_racing_a_renewal_always_gives_the_slot_back(client, db_dsn, conn):
    """Each round, one connection ends a claim while another renews it at the same moment:
    the end must free the slot even when the renewal holds the slot's row, and the renewal
    must not keep it for the ended claim; neither may deadlock the other."""
    ways_out = ["complete", "complete_and_claim", "fail", "release", "rescue", "cancel"]
    rounds, others = 60 * len(ways_out), 40
    # A place for every round, so that a leaked slot shows as a leak, not as a full limit.
    client.set_limit("echo", rounds + others)
    for n in range(others):
        add_task(conn, f"other{n}", priority=1)
    # Renewed with each round's claim, as the supervisor renews all its children's claims
    # at once: the renewal holds slot rows for longer, as it does in a busy daemon.
    renewed_too = [as_claim(row) for row in claim(conn, "echo", limit=others)]
    for n in range(rounds):
        add_task(conn, f"t{n}")
    start = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []
    current: list[dict] = []

    def renewer() -> None:
        with psycopg.connect(db_dsn, autocommit=True) as own:
            for _ in range(rounds):
                start.wait()
                try:
                    store.renew_leases(own, [*renewed_too, as_claim(current[-1])],
                                       lease_seconds=30)
                except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                    errors.append(exc)
                start.wait()

    def rounds_of_ends() -> None:
        with psycopg.connect(db_dsn, autocommit=True) as ender:
            for n in range(rounds):
                (row,) = claim(ender, "echo", limit=1)
                current.append(row)
                start.wait()
                _end(ender, ways_out[n % len(ways_out)], row)
                start.wait()
                leaks.update(conn.execute(
                    "SELECT s.task_id, t.status FROM task_type_slots AS s JOIN tasks AS t "
                    "ON t.id = s.task_id WHERE s.lease_until > now() "
                    "AND (t.status <> 'RUNNING' OR t.lease_token <> s.lease_token)"
                ).fetchall())
                # Back to PENDING (a failure, a release): not run again, so that each round
                # claims a task of its own.
                conn.execute("UPDATE tasks SET status = 'COMPLETED' "
                             "WHERE id = %s AND status = 'PENDING'", (row["id"],))

    leaks: set[tuple] = set()
    thread = threading.Thread(target=renewer)
    thread.start()
    try:
        rounds_of_ends()
    finally:
        start.abort()
        thread.join(30)
    assert not errors, errors[:3]
    by_status = collections.Counter(status for _, status in leaks)
    assert not leaks, f"of {rounds} ended claims these kept their slot: {dict(by_status)}"


def test_a_slot_whose_lease_ran_out_is_free_and_its_late_renewal_is_lost(client, conn):
    client.set_limit("echo", 1)
    add_task(conn, "t0")
    add_task(conn, "t1")
    (first,) = claim(conn, "echo", lease=0.2, worker="killed")
    wait_until(lambda: not held_slots(conn), message="the slot's lease to run out")
    # t0's lease ran out too: the claim may take it over or t1; either way it takes the slot.
    (second,) = claim(conn, "echo", worker="alive")
    assert held_slots(conn) == [second["id"]]
    # The first holder comes back (it was frozen, not dead) and renews: the slot is not its
    # own any more, so neither is its lease, even where its task row is still its own.
    assert store.renew_leases(conn, [as_claim(first, "killed")], lease_seconds=30) == set()
    assert store.renew_leases(conn, [as_claim(second, "alive")],
                              lease_seconds=30) == {second["lease_token"]}


def test_a_task_running_when_its_limit_is_set_takes_a_slot_and_counts(client, conn):
    """Setting a limit rebuilds its slots from the RUNNING tasks: one claimed while the type
    had no limit holds a slot from then on (above the limit when it is full), renews with it
    and gives it back when it ends."""
    for n in range(4):
        add_task(conn, f"t{n}", priority=9 - n)
    old, older = claim(conn, "echo", limit=2)
    client.set_limit("echo", 1)
    assert sorted(held_slots(conn)) == ["t0", "t1"]
    assert client.limits()[0]["running"] == 2
    assert ids(claim(conn, "echo")) == []
    assert store.renew_leases(conn, [as_claim(old), as_claim(older)], lease_seconds=30) == \
        {old["lease_token"], older["lease_token"]}
    # t1 holds the slot above the limit: its end frees nothing a claim may take.
    store.complete_tasks(conn, [as_claim(older)])
    assert ids(claim(conn, "echo")) == [], "t0 still runs: the limit of 1 is full"
    store.complete_tasks(conn, [as_claim(old)])
    assert ids(claim(conn, "echo")) == ["t2"]


def test_lowering_a_limit_stops_nothing_and_the_excess_ends_with_its_tasks(client, conn):
    client.set_limit("echo", 3)
    for n in range(5):
        add_task(conn, f"t{n}")
    rows = claim(conn, "echo")
    assert len(rows) == 3
    result = client.set_limit("echo", 1)
    assert (result["previous"], result["changed"]) == (3, True)
    # All three renew; none of their slots is taken again until two have ended.
    assert store.renew_leases(conn, [as_claim(r) for r in rows], lease_seconds=30) == \
        {r["lease_token"] for r in rows}
    store.complete_and_claim(conn, [as_claim(rows[2])], worker_id="w", task_types=["echo"],
                             lease_seconds=30, limit=5)
    store.complete_and_claim(conn, [as_claim(rows[1])], worker_id="w", task_types=["echo"],
                             lease_seconds=30, limit=5)
    assert ids(claim(conn, "echo")) == []
    store.complete_and_claim(conn, [as_claim(rows[0])], worker_id="w", task_types=[],
                             lease_seconds=30, limit=0)
    assert len(claim(conn, "echo")) == 1
    # The next write of the limit deletes the slots above it that nobody holds.
    client.set_limit("echo", 1)
    assert conn.execute("SELECT max(slot) FROM task_type_slots").fetchone()[0] == 1


def test_removing_a_limit_frees_the_type_and_held_slots_still_renew(client, conn):
    client.set_limit("echo", 1)
    for n in range(3):
        add_task(conn, f"t{n}")
    (held,) = claim(conn, "echo")
    assert client.remove_limit("echo") is True
    assert client.remove_limit("echo") is False
    assert len(claim(conn, "echo")) == 2
    assert store.renew_leases(conn, [as_claim(held)], lease_seconds=30) == {held["lease_token"]}
    assert client.limits() == []


def test_raising_or_removing_a_limit_wakes_idle_workers_and_setting_one_does_not(
        client, conn, listener):
    add_task(conn, "t0")
    add_task(conn, "t1")
    received(listener)  # the inserts' own notifications
    assert client.set_limit("echo", 1)["notified"] is False
    assert client.set_limit("echo", 1)["notified"] is False
    assert received(listener) == []
    assert client.set_limit("echo", 2)["notified"] is True
    assert [(n["types"], n["due"]) for n in received(listener)] == [(["echo"], 2)]
    assert client.remove_limit("echo") is True
    assert [n["types"] for n in received(listener)] == [["echo"]]


def test_limits_lists_what_runs_under_each(client, conn):
    client.set_limit("echo", 2, set_by="ops@example")
    add_task(conn, "t0")
    claim(conn, "echo")
    (row,) = client.limits()
    assert (row["task_type"], row["max_running"], row["running"], row["updated_by"]) == \
        ("echo", 2, 1, "ops@example")


@pytest.mark.parametrize("max_running", [0, -1, 10_001, 1.5, True, "2"])
def test_a_bad_limit_is_refused_with_one_line(client, max_running):
    with pytest.raises(UsageError) as caught:
        client.set_limit("echo", max_running)
    assert "max_running" in str(caught.value) and "\n" not in str(caught.value)
    assert client.limits() == []


def test_a_limit_set_between_two_claims_of_a_connection_binds_the_second(client, conn):
    """Without limits a connection claims through the plain statement; the first claim after
    a limit appears leaves the limited type out, says so, and its share is claimed through
    the slots in the same call."""
    for n in range(4):
        add_task(conn, f"t{n}", priority=4 - n)
    assert ids(claim(conn, "echo", limit=1)) == ["t0"]
    client.set_limit("echo", 2)  # t0, running, takes one of the two places
    assert ids(claim(conn, "echo", limit=5)) == ["t1"]
    assert held_slots(conn) == ["t0", "t1"]
    assert ids(claim(conn, "echo", limit=5)) == []
    client.remove_limit("echo")
    assert ids(claim(conn, "echo", limit=5)) == ["t2", "t3"]


def test_config_claims_a_start_an_operator_and_a_hand_written_claim(client, conn):
    """Each daemon's config is a claim, the smallest one binds: a start drops the claims its
    config no longer makes; `limit TYPE N` holds until a daemon next writes that type;
    `limit TYPE off` drops every claim; a claim no config could make is not one."""
    from supervisor.maintenance.concurrency_limits import write_limits

    def limits() -> dict[str, int]:
        return {r["task_type"]: r["max_running"] for r in client.limits()}

    write_limits(conn, {"echo": 4, "record": 3}, daemon="a", starting=True)
    write_limits(conn, {"echo": 2}, daemon="b", starting=True)
    assert limits() == {"echo": 2, "record": 3}
    # a forged claim past what any config may set would make a billion slot rows
    conn.execute("INSERT INTO task_type_limit_claims (task_type, daemon, max_running) "
                 "VALUES ('echo', 'c', 2000000000), ('record', 'c', 2000000000)")
    write_limits(conn, {"echo": 4}, daemon="a", starting=True)  # restarted without record
    assert limits() == {"echo": 2}

    client.set_limit("echo", 7)  # the operator's, over the claims
    assert limits() == {"echo": 7}
    write_limits(conn, {"echo": 1}, daemon="b", drop=frozenset({"echo"}))
    assert limits() == {"echo": 1}
    write_limits(conn, {}, daemon="b", drop=frozenset({"echo"}))
    assert limits() == {"echo": 4}
    assert client.limits()[0]["claims"] == ["a=4", "c=2000000000"]

    assert client.remove_limit("echo")
    assert conn.execute("SELECT count(*) FROM task_type_limit_claims "
                        "WHERE task_type = 'echo'").fetchone()[0] == 0
    client.set_limit("works", 5)
    write_limits(conn, {}, daemon="a", starting=True)  # no claim on works: not a's to drop
    assert limits() == {"works": 5}


@pytest.mark.parametrize("batch", [1, 3])
def test_a_lone_completion_write_does_not_let_the_next_claim_skip_a_limited_type(client, conn,
                                                                                batch):
    """Issue 14.6: a completion written alone (no types asked, as the batch guard and a
    stopping worker write them) said nothing about limits; the connection's next claim then
    went through the plain statement, which leaves limited types out, and took priority-0
    tasks of an unlimited type ahead of due priority-9 tasks of a limited type with free
    slots."""
    client.set_limit("echo", 2)
    add_task(conn, "first", "echo", priority=9)
    (first,) = claim(conn, "echo", "record", limit=1)  # the connection knows of the limit
    assert first["id"] == "first"
    for n in range(2):
        add_task(conn, f"echo-{n}", "echo", priority=9)
    for n in range(3):
        add_task(conn, f"record-{n}", "record", priority=0)
    assert store.complete_tasks(conn, [as_claim(first)]) == {first["lease_token"]}
    rows = claim(conn, "echo", "record", limit=batch)
    assert ids(rows) == ["echo-0", "echo-1", "record-0"][:batch]


def test_the_first_claim_after_a_limit_appears_keeps_the_priority_order(client, conn):
    """A connection that last claimed without limits learns of one from the plain
    statement's answer: that statement must not have taken lower-priority tasks of other
    types meanwhile."""
    add_task(conn, "warm", "record")
    assert ids(claim(conn, "echo", "record", limit=1)) == ["warm"]
    client.set_limit("echo", 1)
    add_task(conn, "echo-0", "echo", priority=9)
    add_task(conn, "record-0", "record", priority=0)
    assert ids(claim(conn, "echo", "record", limit=1)) == ["echo-0"]


# -- slot rows written by plain SQL (issue 15, items 6 and 11) ---------------------------------


def repair(conn) -> dict:
    return store.repair_limit_slots(conn)


@pytest.mark.parametrize("new_limit", [1, 2])
def test_setting_a_limit_after_its_slots_were_deleted_rebuilds_them_from_the_running_tasks(
        client, conn, new_limit):
    """Issue 15.6: slot rows deleted by SQL, then `limit T N` recreated them free while the
    first owner still ran: a second claim took its place."""
    client.set_limit("echo", 1)
    for n in range(3):
        add_task(conn, f"t{n}", priority=3 - n)
    (first,) = claim(conn, "echo", limit=3)
    conn.execute("DELETE FROM task_type_slots")
    client.set_limit("echo", new_limit)
    assert held_slots(conn) == ["t0"]
    assert ids(claim(conn, "echo", limit=3)) == ["t1", "t2"][:new_limit - 1]
    # The first owner still holds its place, and renews it.
    assert store.renew_leases(conn, [as_claim(first)], lease_seconds=30) == \
        {first["lease_token"]}
    assert (client.limits()[0]["running"]) == new_limit


def test_a_renewal_whose_slot_vanished_is_lost(client, conn):
    client.set_limit("echo", 1)
    add_task(conn, "t0")
    (row,) = claim(conn, "echo", lease=30)
    conn.execute("DELETE FROM task_type_slots")
    assert store.renew_leases(conn, [as_claim(row)], lease_seconds=30) == set()


@pytest.mark.parametrize("damage", ["deleted", "infinity_ended", "infinity_running",
                                    "null_lease", "no_task", "null_token"])
def test_the_repair_frees_what_no_live_claim_holds_and_bounds_what_one_does(client, conn,
                                                                          damage):
    """Issue 15.11: slots deleted, or held by 'infinity', stalled a limited type for good,
    and neither a restart nor `limit off` + `limit 2` repaired them. The reaper's repair
    frees a slot whose claim ended or is gone, recreates missing slots, and bounds a slot's
    lease by its task's, so a slot never outlives its claim's lease."""
    client.set_limit("echo", 2)
    for n in range(4):
        add_task(conn, f"t{n}", priority=4 - n)
    first, second = claim(conn, "echo", limit=2, lease=1)
    if damage == "deleted":
        conn.execute("DELETE FROM task_type_slots")
    elif damage == "infinity_ended":
        # Both claims end without their slots (plain SQL frees none); the slots say forever.
        conn.execute("UPDATE tasks SET status = 'COMPLETED' WHERE status = 'RUNNING'")
        conn.execute("UPDATE task_type_slots SET lease_until = 'infinity'")
    elif damage == "infinity_running":
        conn.execute("UPDATE task_type_slots SET lease_until = 'infinity'")
    elif damage == "null_lease":
        conn.execute("UPDATE task_type_slots SET lease_until = NULL")
    elif damage == "no_task":
        conn.execute("UPDATE task_type_slots SET task_id = 'nobody', "
                     "lease_until = 'infinity'")
    else:
        conn.execute("UPDATE task_type_slots SET lease_token = NULL, "
                     "lease_until = 'infinity'")
    repair(conn)
    if damage in ("infinity_ended", "no_task", "null_token"):
        assert held_slots(conn) == []  # no live claim holds them: free now
    else:
        # The two claims still run: they keep their places until their 1 s leases end.
        assert held_slots(conn) == ["t0", "t1"]
        assert ids(claim(conn, "echo", limit=2)) == []
        wait_until(lambda: not held_slots(conn), timeout=5,
                   message="the slots to end with their tasks' leases")
    rows = claim(conn, "echo", limit=4, worker="next")
    assert len(rows) == 2, "the limit is usable again"


def test_limit_off_and_on_repairs_infinite_slots_and_limits_counts_running_tasks(client,
                                                                                conn):
    client.set_limit("echo", 2)
    for n in range(4):
        add_task(conn, f"t{n}")
    claim(conn, "echo", limit=2)
    conn.execute("UPDATE tasks SET status = 'COMPLETED' WHERE status = 'RUNNING'")
    conn.execute("UPDATE task_type_slots SET lease_until = 'infinity'")
    assert client.limits()[0]["running"] == 0, "no task runs"
    assert client.remove_limit("echo")
    client.set_limit("echo", 2)
    assert len(claim(conn, "echo", limit=4)) == 2
    assert client.limits()[0]["running"] == 2


def test_no_value_in_a_slot_row_aborts_the_claims_or_the_repair(client, conn):
    """Plain SQL may write anything a column holds; every statement that reads slot rows
    serves other tasks too."""
    client.set_limit("echo", 3)
    client.set_limit("record", 1)
    add_task(conn, "r0", "record")
    conn.execute("DELETE FROM task_type_slots WHERE task_type = 'echo'")
    conn.execute("INSERT INTO task_type_slots VALUES "
                 "('echo', 1, repeat('x', 10000), 9223372036854775807, '-infinity'), "
                 "('echo', 2, '', -9223372036854775808, 'infinity'), "
                 "('echo', 2147483647, 'ghost', 1, 'infinity'), "
                 "('unlimited', 1, 'ghost', 1, NULL)")
    conn.execute("UPDATE tasks SET slot = -1 WHERE id = 'r0'")
    for n in range(3):
        add_task(conn, f"e{n}")
    repair(conn)
    assert sorted(ids(claim(conn, "echo", "record", limit=5))) == ["e0", "e1", "e2", "r0"]
    repair(conn)
    assert client.limits()[0]["running"] == 3


def test_the_repair_changes_nothing_that_claims_renewals_and_ends_are_doing(client, db_dsn,
                                                                           conn):
    """The repair runs on every daemon's reaper beside every claim: racing claimers that
    complete, fail, release and renew in batches, it must find nothing to repair, and the
    limit holds by the task rows at every moment."""
    client.set_limit("echo", 3)
    for n in range(300):
        add_task(conn, f"t{n}", max_retries=0)
    stop = threading.Event()
    errors: list[BaseException] = []
    repaired: list[dict] = []
    most = [0]

    def claimer(n: int) -> None:
        try:
            with psycopg.connect(db_dsn, autocommit=True) as own:
                done: list[store.Claim] = []
                while not stop.is_set():
                    _, rows = store.complete_and_claim(own, done, worker_id=f"w{n}",
                                                       task_types=["echo"], lease_seconds=30,
                                                       limit=2)
                    claims = [as_claim(row, f"w{n}") for row in rows]
                    store.renew_leases(own, claims, lease_seconds=30)
                    done = []
                    for i, one in enumerate(claims):
                        if i % 3 == 1:
                            store.release_tasks(own, [(one.task_id, one.token)])
                        elif i % 5 == 2:
                            store.fail_attempt(own, one, error="x", permanent=True,
                                               retry=NO_BACKOFF)
                        else:
                            done.append(one)
                    if not rows:
                        store.complete_tasks(own, done)
                        done = []
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def repairer() -> None:
        try:
            with psycopg.connect(db_dsn, autocommit=True) as own:
                while not stop.is_set():
                    repaired.append(store.repair_limit_slots(own))
                    running = own.execute("SELECT count(*) FROM tasks "
                                          "WHERE status = 'RUNNING'").fetchone()[0]
                    most[0] = max(most[0], running)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=repairer) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: errors or conn.execute(
            "SELECT count(*) FROM tasks WHERE status IN ('PENDING', 'RUNNING')"
        ).fetchone()[0] == 0, timeout=60, message="every task to end")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors[:3]
    assert len(repaired) > 10
    assert [r for r in repaired if any(r.values())] == []
    assert most[0] <= 3
    assert held_slots(conn) == []


def backends_waiting_on_a_lock(conn, application_name: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
        "AND wait_event_type = 'Lock' AND datname = current_database()",
        (application_name,)).fetchone()[0]


@pytest.mark.parametrize("way_out", ["complete", "complete_and_claim", "release", "fail",
                                     "rescue", "cancel"])
def test_claims_ended_while_a_limit_set_adopts_them_keep_no_slot(client, db_dsn, conn,
                                                                 way_out, monkeypatch):
    """Setting a limit gives each task running without a slot one (adopt_running_tasks).
    Two such claims end while it does, held up by a session that holds the free slot it
    writes (one slot is that free row, the other a new row): an end that committed before the
    setter wrote the slot rows left them held by ended tasks, and an end that waited for the
    setter's lock on its task row named a slot its statement could not see, so kept it.
    Either way the type ran one task fewer per leak until the slot's lease ran out."""
    for task_id in ("gone", "held", "a", "b"):
        add_task(conn, task_id)
    claim(conn, "echo", limit=2)  # gone, held: added first, claimed first
    client.set_limit("echo", 3)
    client.remove_limit("echo")  # slots 1 and 2 stay held by gone and held; 3 goes
    racing = claim(conn, "echo", limit=2)  # a, b: without a slot
    assert sorted(ids(racing)) == ["a", "b"]
    store.complete_tasks(conn, [store.Claim("gone", "w", task_row(conn, "gone")["lease_token"])])
    assert held_slots(conn) == ["held"]
    # The setter waits for the held slot row as long as it takes, its task rows locked.
    monkeypatch.setattr(store, "ADOPT_TRIES", 0)
    errors: list[BaseException] = []

    def in_thread(work, application_name: str) -> threading.Thread:
        def run() -> None:
            try:
                with psycopg.connect(db_dsn, autocommit=True,
                                     application_name=application_name) as own:
                    if way_out == "complete_and_claim":
                        claim(own, "record")  # this connection now claims unlimited
                    work(own)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    with psycopg.connect(db_dsn) as holder:
        holder.execute("SELECT 1 FROM task_type_slots WHERE task_type = 'echo' AND slot = 1 "
                       "FOR UPDATE")
        setter = in_thread(lambda own: store.set_task_type_limit(own, "echo", 2,
                                                                 updated_by="test"), "setter")
        wait_until(lambda: errors or backends_waiting_on_a_lock(conn, "setter"),
                   message="the setter to wait for the free slot's row")
        if way_out in ("complete", "complete_and_claim", "release"):
            enders = [in_thread(lambda own: _end(own, way_out, racing[0], racing[1:]),
                                "ender")]
        else:
            enders = [in_thread(lambda own, row=row: _end(own, way_out, row), "ender")
                      for row in racing]
        wait_until(lambda: errors or not any(e.is_alive() for e in enders)
                   or backends_waiting_on_a_lock(conn, "ender") == len(enders),
                   message="the ends to land or to wait for the setter")
        holder.rollback()
    for thread in (setter, *enders):
        thread.join(30)
    assert not errors, errors[:3]
    assert {task_row(conn, row["id"])["status"] for row in racing} <= \
        {"COMPLETED", "PENDING", "FAILED", "CANCELLED"}
    assert held_slots(conn) == ["held"]
    assert store.repair_limit_slots(conn) == {"freed": 0, "bounded": 0, "restored_held": 0,
                                              "restored_free": 0}


def test_a_setter_gives_way_to_a_batch_that_locks_its_tasks_in_another_order(client, db_dsn,
                                                                             conn):
    """A batch's end locks its task rows in the order its plan reads them; the setter locks
    the running tasks' rows by id. A session stands in for such a batch: it holds b, the
    setter holds a and waits for b, then the batch asks for a. The setter lets go and starts
    again; neither is aborted as a deadlock, and both tasks, still running, count."""
    add_task(conn, "a")
    add_task(conn, "b")
    claim(conn, "echo", limit=2)
    outcome: list = []
    with psycopg.connect(db_dsn) as batch:
        batch.execute("SELECT 1 FROM tasks WHERE id = 'b' FOR UPDATE")

        def set_limit() -> None:
            with psycopg.connect(db_dsn, autocommit=True, application_name="setter") as own:
                try:
                    outcome.append(store.set_task_type_limit(own, "echo", 1, updated_by="t"))
                except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                    outcome.append(exc)
        setter = threading.Thread(target=set_limit)
        setter.start()
        wait_until(lambda: outcome or backends_waiting_on_a_lock(conn, "setter"),
                   message="the setter to wait for b")
        batch.execute("SELECT 1 FROM tasks WHERE id = 'a' FOR UPDATE")
        batch.commit()
    setter.join(30)
    assert not isinstance(outcome[0], BaseException), outcome
    assert sorted(held_slots(conn)) == ["a", "b"]


def test_limits_set_and_removed_while_claims_race_deadlock_nothing_and_leak_no_slot(client,
                                                                                  db_dsn,
                                                                                  conn):
    """Each setting rebuilds the slots and gives running tasks theirs while claimers claim,
    renew and complete in batches: no statement fails (a deadlock would abort one), and
    once every task ended no slot is held."""
    for n in range(400):
        add_task(conn, f"t{n}", max_retries=0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            with psycopg.connect(db_dsn, autocommit=True) as own:
                done: list[store.Claim] = []
                while not stop.is_set():
                    _, rows = store.complete_and_claim(own, done, worker_id=f"w{n}",
                                                       task_types=["echo"], lease_seconds=30,
                                                       limit=3)
                    done = [as_claim(row, f"w{n}") for row in rows]
                    store.renew_leases(own, done, lease_seconds=30)
                    if not rows:
                        stop.wait(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        for round_ in range(30):
            client.set_limit("echo", 1 + round_ % 3)
            client.remove_limit("echo")
        client.set_limit("echo", 2)
        wait_until(lambda: errors or conn.execute(
            "SELECT count(*) FROM tasks WHERE status = 'PENDING'").fetchone()[0] == 0,
            timeout=60, message="every task to be claimed")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not errors, errors[:3]
    # The claimers' last claims are still RUNNING; their completions end them.
    for row in conn.execute("SELECT id, claimed_by, lease_token FROM tasks "
                            "WHERE status = 'RUNNING'").fetchall():
        assert store.complete_tasks(conn, [store.Claim(*row)]) == {row[2]}
    assert held_slots(conn) == []
    assert store.repair_limit_slots(conn) == {"freed": 0, "bounded": 0, "restored_held": 0,
                                              "restored_free": 0}
