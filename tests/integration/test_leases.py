"""Leases: renewal, expiry, takeover, and the fencing token that silences an old owner."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import make_config, wait_until
from supervisor.channel import Link, socket_pair
from supervisor.config import RetryConfig
from supervisor.daemon.children import Child
from supervisor.db import store
from supervisor.lease_keeper import Held, LeaseKeeper
from supervisor.lease_timing import stop_margin
from supervisor.worker.leases import SupervisedLeases
from worker_fixtures import add_task, expire_lease, looping, task_row

pytest_plugins = ["worker_fixtures"]

NO_DELAY = RetryConfig(base_delay=0.0, max_delay=0.0, jitter=0.0)


def claim(conn, worker_id: str, types=("echo",), lease_seconds: float = 30):
    return store.claim_task(conn, worker_id=worker_id, task_types=types,
                            lease_seconds=lease_seconds)


def claim_of(row: dict, worker_id: str) -> store.Claim:
    return store.Claim(row["id"], worker_id, row["lease_token"])


def test_task_becomes_claimable_after_its_lease_expires(conn):
    add_task(conn, "t1")
    first = claim(conn, "worker-a", lease_seconds=0.2)
    # worker-a never renews, as if it had died; the lease runs out in the database's time.
    taken = wait_until(lambda: claim(conn, "worker-b"), timeout=10,
                       message="the expired task to be claimable")
    assert taken["id"] == "t1"
    assert taken["claimed_by"] == "worker-b"
    assert taken["lease_token"] != first["lease_token"]
    assert taken["attempts"] == 2
    # The abandoned run counts as a failed attempt.
    assert taken["retry_count"] == 1
    assert "worker-a" in taken["error_message"]


def test_a_live_lease_blocks_other_claims_until_it_runs_out(conn):
    add_task(conn, "t1")
    claim(conn, "worker-a", lease_seconds=30)
    assert claim(conn, "worker-b") is None
    expire_lease(conn, "t1")
    assert claim(conn, "worker-b")["id"] == "t1"


def test_an_expired_task_with_its_retries_spent_is_left_to_the_reaper(conn):
    add_task(conn, "t1", max_retries=0)
    claim(conn, "worker-a")
    expire_lease(conn, "t1")
    assert claim(conn, "worker-b") is None
    reaped = store.reap_expired_leases(conn, batch_size=10, retry=NO_DELAY)
    assert [(r["id"], r["status"]) for r in reaped] == [("t1", "FAILED")]
    stored = task_row(conn, "t1")
    assert stored["claimed_by"] is None and stored["finished_at"] is not None
    assert "worker-a" in stored["error_message"]


def test_reaper_returns_an_expired_task_to_pending_after_a_backoff(conn):
    add_task(conn, "expired")
    add_task(conn, "live")
    claim(conn, "worker-a")
    claim(conn, "worker-b")
    expire_lease(conn, "expired")
    retry = RetryConfig(base_delay=30.0, max_delay=600.0, jitter=0.0)

    reaped = store.reap_expired_leases(conn, batch_size=10, retry=retry)

    assert [(r["id"], r["status"], r["retry_count"]) for r in reaped] == [("expired", "PENDING", 1)]
    assert reaped[0]["retry_delay"] == pytest.approx(30, abs=0.5)
    stored = task_row(conn, "expired")
    assert stored["claimed_by"] is None and stored["lease_until"] is None
    assert (stored["scheduled_time"] - stored["updated_at"]).total_seconds() == pytest.approx(30)
    assert task_row(conn, "live")["status"] == "RUNNING"
    assert store.reap_expired_leases(conn, batch_size=10, retry=retry) == []


def test_renew_lease_extends_the_lease_of_the_current_owner(conn):
    add_task(conn, "t1")
    row = claim(conn, "worker-a", lease_seconds=1)
    assert store.renew_lease(conn, claim_of(row, "worker-a"), lease_seconds=60)
    lease_left = conn.execute("SELECT extract(epoch FROM lease_until - now()) FROM tasks "
                              "WHERE id = 't1'").fetchone()[0]
    assert 55 < lease_left <= 60


@pytest.mark.parametrize("new_owner", ["worker-b", "worker-a"],
                         ids=["taken-by-another-worker", "taken-by-the-same-worker-id"])
def test_an_old_owner_cannot_write_after_a_takeover(conn, new_owner):
    add_task(conn, "t1")
    old = claim_of(claim(conn, "worker-a"), "worker-a")
    expire_lease(conn, "t1")
    new = claim_of(claim(conn, new_owner), new_owner)
    assert new.token != old.token
    before = task_row(conn, "t1")

    assert store.renew_lease(conn, old, lease_seconds=30) is False
    assert store.complete_task(conn, old) is False
    assert store.fail_attempt(conn, old, error="late", permanent=False, retry=NO_DELAY) is None
    assert store.fail_attempt(conn, old, error="late", permanent=True, retry=NO_DELAY) is None
    assert store.release_task(conn, "t1", old.token) is False
    assert store.rescue_task(conn, "t1", old.token, error="late", retry=NO_DELAY) is None

    assert task_row(conn, "t1") == before, "a write of the old claim changed the row"
    assert store.complete_task(conn, new)
    assert task_row(conn, "t1")["status"] == "COMPLETED"


@pytest.mark.parametrize("new_owner", ["worker-b", "worker-1"],
                         ids=["taken-by-another-worker", "taken-by-the-same-worker-id"])
@pytest.mark.parametrize("task_type", ["echo", "fail"])
def test_worker_discards_its_result_when_the_claim_was_taken_over(conn, make_worker, events,
                                                                   new_owner, task_type):
    worker = make_worker(worker_id="worker-1")
    add_task(conn, "t1", task_type=task_type)
    stale_row = claim(conn, "worker-1", types=(task_type,))
    expire_lease(conn, "t1")
    current = claim(conn, new_owner, types=(task_type,))
    before = task_row(conn, "t1")

    outcome = worker.run_claimed([stale_row])[0]

    assert outcome.name == "stale"
    assert task_row(conn, "t1") == before
    assert current["lease_token"] == before["lease_token"]
    discarded = events.of("stale_result_discarded")
    assert [e["token"] for e in discarded] == [stale_row["lease_token"]]
    assert discarded[0]["result"] == ("completed" if task_type == "echo" else "failed")


def test_a_running_handler_learns_of_a_takeover_within_one_renew_interval(conn, db_dsn,
                                                                          make_worker, events):
    config = make_config(db_dsn, lease={"seconds": 1.5, "renew_interval": 0.3})
    worker = make_worker(config, worker_id="worker-1", types=["cooperative"])
    add_task(conn, "t1", task_type="cooperative", payload={"max_seconds": 20})
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(worker.run_once()))
    runner.start()
    wait_until(lambda: task_row(conn, "t1")["status"] == "RUNNING", message="the claim")

    expire_lease(conn, "t1")
    taken = claim(conn, "worker-2", types=("cooperative",))
    assert taken is not None
    runner.join(0.3 + 0.5)

    assert not runner.is_alive(), "the handler kept running on a task it no longer owns"
    # Nobody cancelled it: a takeover is a stale claim, not a cancellation.
    assert outcome[0].name == "stale"
    assert not events.of("task_cancelled"), events.names()
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["claimed_by"]) == ("RUNNING", "worker-2")
    assert stored["lease_token"] == taken["lease_token"]
    assert events.of("lease_lost"), events.names()


class _LinkedChild:
    """The supervisor's view of one child, as far as its lease keeper needs: the renewal
    message is the daemon's own (Child.renewed); each end sent is kept for the test."""
    label = "default#1"

    def __init__(self, link: Link):
        self.link = link
        self.sent: list[float] = []

    def alive(self) -> bool:
        return True

    def renewed(self, tokens: list[int], expires_at: float) -> None:
        Child.renewed(self, tokens, expires_at)
        self.sent.append(expires_at)

    def lost(self, token: int, reason: str) -> bool:
        return Child.lost(self, token, reason)


def test_a_renewal_that_shortens_the_lease_ends_the_handlers_view_of_it(conn, db_dsn,
                                                                       make_worker):
    """Issue 14, item 1: the child claimed under a 30 s lease; its supervisor renews it with
    3 s (claims made under a shorter lease, a reload apart), then no more (its connection
    stalled). The child must take the end the renewal wrote, not keep its own longer one:
    is_cancelled() turns true stop_margin before that end (so before the end written in the
    database, which the renewal started at its now()), not earlier. A child that only ever
    lengthened its view (Task.extend) believed it owned the task for 27 s more."""
    config = make_config(db_dsn, lease={"seconds": 30, "renew_interval": 10})
    margin = stop_margin(config.lease.seconds)
    checks: list[tuple[float, bool]] = []
    lost = threading.Event()

    def watch(task):
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            cancelled = task.is_cancelled()
            checks.append((time.monotonic(), cancelled))
            if cancelled:
                lost.set()
                return
            time.sleep(0.01)

    supervisor_sock, child_sock = socket_pair()
    supervisor = Link(supervisor_sock, blocking=False)
    child = _LinkedChild(supervisor)
    worker = make_worker(config, handlers={"watch": watch},
                         leases=lambda w: SupervisedLeases(Link(child_sock, blocking=True), w,
                                                           pool_name="default"))
    keeper = LeaseKeeper(db_dsn, renew_interval=10, retry=config.retry)
    keeper.start()
    add_task(conn, "t1", "watch")
    try:
        with looping(worker):
            (claimed,) = wait_until(
                lambda: [m for m in supervisor.receive()[0] if m["kind"] == "claimed"],
                message="the child's claim")
            ((task_id, token, task_type),) = claimed["claims"]
            keeper.hold([Held(task_id, token, task_type, "worker-1", "default", holder=child,
                              lease_seconds=3, renew_interval=2)])
            # Dropped at once: the next renewal would be due a second later.
            wait_until(lambda: child.sent, message="the shorter renewal")
            keeper.drop([token])
            (written,) = child.sent
            assert conn.execute("SELECT lease_until - now() < interval '3.1 seconds' FROM tasks"
                                " WHERE id = 't1'").fetchone()[0], "the renewal did not shorten"
            assert lost.wait(12), "the handler never saw the shortened lease end"
    finally:
        keeper.stop()
    first_true = next(at for at, cancelled in checks if cancelled)
    assert all(not cancelled for at, cancelled in checks if at < written - margin)
    assert written - margin <= first_true < written - margin + 0.3, \
        (first_true - (written - margin))


def test_lease_renewal_moves_lease_until_forward_while_the_handler_runs(conn, db_dsn, make_worker,
                                                                       events):
    config = make_config(db_dsn, lease={"seconds": 1.5, "renew_interval": 0.3})
    worker = make_worker(config, types=["sleep"])
    add_task(conn, "t1", task_type="sleep", payload={"seconds": 2.5})

    def lease_state():
        return conn.execute("SELECT status, lease_until, lease_until > now() FROM tasks "
                            "WHERE id = 't1'").fetchone()

    with looping(worker):
        first = wait_until(lambda: (s := lease_state())[0] == "RUNNING" and s,
                           message="the claim")[1]
        seen = [first]
        while (state := lease_state())[0] == "RUNNING":
            status, lease_until, live = state
            # The handler runs longer than one lease: without renewals it would lapse.
            assert live, "the lease lapsed while its handler ran"
            if lease_until != seen[-1]:
                assert lease_until > seen[-1]
                seen.append(lease_until)
            wait_until(lambda: lease_state() != state, timeout=5,
                       message="the lease to move or the task to finish")
        wait_until(lambda: lease_state()[0] == "COMPLETED", message="completion")

    assert len(seen) >= 4, f"lease_until moved only {len(seen) - 1} times in a 2.5 s run"
    assert (seen[-1] - first).total_seconds() > 1.5
    assert len(events.of("lease_renewed")) >= 3


def test_a_running_row_without_a_lease_is_reaped_beside_expired_ones(conn):
    # A row set to RUNNING by plain SQL with no lease_until: no owner renews it and no claim
    # takes it over, so only the reaper can end it; it must not hide the expired ones.
    add_task(conn, "no-lease", max_retries=0)
    add_task(conn, "expired")
    add_task(conn, "live")
    conn.execute("UPDATE tasks SET status = 'RUNNING', claimed_by = 'someone', "
                 "lease_token = 7, lease_until = NULL WHERE id = 'no-lease'")
    claim(conn, "worker-a")
    claim(conn, "worker-b")
    expire_lease(conn, "expired")
    reaped = store.reap_expired_leases(conn, batch_size=10, retry=NO_DELAY)
    assert sorted((r["id"], r["status"]) for r in reaped) == [
        ("expired", "PENDING"), ("no-lease", "FAILED")]
    assert "no lease" in task_row(conn, "no-lease")["error_message"]
    assert task_row(conn, "live")["status"] == "RUNNING"
    assert store.reap_expired_leases(conn, batch_size=10, retry=NO_DELAY) == []


def test_a_stale_claim_beside_the_live_one_in_one_statement_costs_the_live_one_nothing(conn):
    """The supervisor renews every child's claims in one statement, and a child reports a
    claim it gave back only with its next message: a task given back and claimed again sits
    in one renewal twice, stale token first. The reload storm saw the live claim judged
    lost (each token was looked up by the task's first place in the list) and its handler
    cancelled and FAILED. Renewal, release and completion match each (id, token) pair."""
    add_task(conn, "t1")
    stale = claim(conn, "worker-a")
    assert store.release_tasks(conn, [("t1", stale["lease_token"])]) == {"t1"}
    live = claim(conn, "worker-b")
    both = [claim_of(stale, "worker-a"), claim_of(live, "worker-b")]
    assert store.renew_leases(conn, both, lease_seconds=60) == {live["lease_token"]}
    assert store.release_tasks(conn, [("t1", stale["lease_token"]), ("t1", live["lease_token"])]
                               ) == {"t1"}
    again = claim(conn, "worker-b")
    done = store.complete_tasks(conn, [claim_of(stale, "worker-b"), claim_of(again, "worker-b")],
                                usage=[(1.0, 1), (2.5, 7)])
    assert done == {again["lease_token"]}
    row = task_row(conn, "t1")
    assert (row["status"], row["cpu_seconds"], row["peak_rss_bytes"]) == ("COMPLETED", 2.5, 7)
