"""Lease renewal from outside the handler's interpreter, and settling orphaned claims.

A worker's handler can hold the GIL for longer than a lease (a big regex, a compression
call, a native library): a renewal thread inside the worker then cannot run, the lease
lapses, and another worker starts the same task while the first still runs it. So the
supervisor renews the leases of every claim its children hold, in one statement per round,
on a thread of its own; it only needs each child's claims (from the pipe) and whether the
child still lives. A child that is stopped (SIGSTOP, a debugger) is not renewed for: it
makes no progress, and its task should pass to a worker that does (the claims it never
started go back sooner, free, and the runs it finished are written:
supervisor/daemon/stopped_children.py).

The same thread settles claims whose holder is gone, through a queue the main loop fills:
a dead child's claim counts as a failed attempt at once, a claim the supervisor stopped on
purpose is released without spending a retry. A claim the keeper found lost (cancelled) is
remembered until its holder settles it: should the holder die first, the slot the cancel
left that claim (a limited type's, held while its handler ran) is given back then. The main
loop never waits on the database; a settling pass stops at the first connection error and
is retried with backoff.

``LeaseKeeper`` serves an in-process worker (``pgtaskd worker``, the tests) the same way,
with a holder that updates the worker's tasks directly.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import psycopg

from . import metrics
from .config import RetryConfig
from .db import store
from .db.connect import LazyConnection, worker_application_name
from .db.deadline import within
from .errors import OperationalError, one_line
from .lease_timing import renew_retry_delay
from .logs import emit

# A renewal round also renews claims due within this fraction of the renew interval, so a
# daemon's claims fall into step and one statement serves them all.
GROUPING = 0.5
# The longest a renewal or settling statement may wait for an answer.
MAX_STATEMENT_SECONDS = 10.0
SETTLE_MAX_BACKOFF = 30.0
# How often to look again for a dead child's statements still running in the database.
UNHEARD_RECHECK = 0.05


class _StillRunning(Exception):
    """A dead child's backend still runs a statement: its claims are not all visible yet."""


class Holder(Protocol):
    """Who holds claims: told of every renewal and every loss."""
    label: str

    def alive(self) -> bool: ...

    def renewed(self, tokens: list[int], expires_at: float) -> None: ...

    def lost(self, token: int, reason: str) -> None: ...


@dataclass(eq=False)
class Held:
    """One claim the keeper renews, under the lease settings it was made with: a reload that
    changes them applies to new claims only, so no claim waits for a renewal by an interval
    longer than its lease allows."""
    task_id: str
    token: int
    task_type: str
    worker_id: str
    pool: str
    holder: Holder
    lease_seconds: float
    renew_interval: float
    due: float = 0.0  # monotonic time of the next renewal

    def claim(self) -> store.Claim:
        return store.Claim(self.task_id, self.worker_id, self.token)


@dataclass(frozen=True)
class Settlement:
    """Claims to settle: ``rescue`` counts the run as a failed attempt (its worker died while
    it ran), ``release`` gives the task back without spending a retry (it never started, or
    we stopped the worker), ``complete`` writes the completion of a run whose handler
    succeeded before its worker died. A rescued run is recorded in its task's failed
    attempts with ``outcome`` (crashed, timeout, killed) and the ``signal`` that killed its
    worker, if one did."""
    kind: str
    claims: tuple[Held, ...]
    reason: str
    unheard: "Unheard | None" = None
    outcome: str = "crashed"
    signal: str | None = None


@dataclass(frozen=True)
class Unheard:
    """A dead child's claims to look for: those it made but died before telling us of.
    Settled like the others, by what its claim board says of each token (nothing: never
    started). ``running_kind`` is how a started one is settled (rescue, or release when we
    stopped the child on purpose)."""
    worker_id: str
    pool: str
    holder: Holder
    died_at: float  # monotonic
    known_tokens: frozenset[int]
    states: dict
    running_kind: str
    lease_seconds: float
    renew_interval: float


class LeaseKeeper(threading.Thread):
    def __init__(self, dsn: str, *, renew_interval: float,
                 retry: RetryConfig, connect_timeout: float = 5.0,
                 application_name: str = "pgtaskd leases", pooled: bool = False,
                 on_cancelled: Callable[[str], None] = lambda task_id: None):
        super().__init__(name="leases", daemon=True)
        # Only how often the thread looks when it holds nothing: each claim is renewed by the
        # settings it was made under (Held).
        self.renew_interval = renew_interval
        self.retry = retry
        self._db = LazyConnection(dsn, connect_timeout=connect_timeout,
                                  application_name=application_name, pooled=pooled)
        self._wakeup = threading.Condition()
        self._held: dict[int, Held] = {}
        # Claims found lost (cancelled, taken over) that their holder has not settled yet.
        self._lost: dict[int, Held] = {}
        self._settlements: collections.deque[Settlement] = collections.deque()
        self._settle_at = 0.0
        self._settle_failures = 0
        self._renew_failing = False
        self._stopping = False
        self.on_cancelled = on_cancelled

    # -- called from other threads (never blocks on the database) ----------------------------

    def hold(self, claims: Sequence[Held]) -> None:
        """Start renewing these claims, each first at its own renew interval from now."""
        now = time.monotonic()
        with self._wakeup:
            # No notify when the thread already wakes before these are due: waking it per
            # claim costs the supervisor a thread switch each.
            wake = False
            for held in claims:
                held.due = now + held.renew_interval
                self._held[held.token] = held
                wake = wake or held.renew_interval < self.renew_interval
            if wake:
                self._wakeup.notify()

    def drop(self, tokens: Sequence[int]) -> None:
        """Stop renewing these claims: settled by their holder."""
        with self._wakeup:
            for token in tokens:
                self._held.pop(token, None)
                self._lost.pop(token, None)

    def drop_holder(self, holder: Holder) -> list[Held]:
        """Stop renewing everything ``holder`` held; returns those claims, with those it lost
        and had not settled yet (their runs are over too)."""
        with self._wakeup:
            claims = [h for h in self._held.values() if h.holder is holder]
            for held in claims:
                del self._held[held.token]
            lost = [h for h in self._lost.values() if h.holder is holder]
            for held in lost:
                del self._lost[held.token]
        return claims + lost

    def settle(self, kind: str, claims: Sequence[Held], reason: str, *,
               outcome: str = "crashed", signal: str | None = None) -> None:
        if not claims:
            return
        with self._wakeup:
            for held in claims:
                self._held.pop(held.token, None)
                self._lost.pop(held.token, None)
            self._settlements.append(Settlement(kind, tuple(claims), reason, outcome=outcome,
                                                signal=signal))
            self._wakeup.notify()

    def settle_tokens(self, kind: str, holder: Holder, tokens: Sequence[int],
                      reason: str) -> list[Held]:
        """``settle`` those of these claims that ``holder`` still holds here; those claims."""
        with self._wakeup:
            claims = [self._held.pop(t) for t in tokens
                      if t in self._held and self._held[t].holder is holder]
            if claims:
                self._settlements.append(Settlement(kind, tuple(claims), reason))
                self._wakeup.notify()
        return claims

    def settle_unheard(self, unheard: Unheard, reason: str, *, outcome: str = "crashed",
                       signal: str | None = None) -> None:
        """After a child's death: settle the claims it made and never told us of."""
        with self._wakeup:
            self._settlements.append(Settlement("unheard", (), reason, unheard,
                                                outcome=outcome, signal=signal))
            self._wakeup.notify()

    def unsettled(self) -> list[str]:
        """Task ids still waiting to be settled."""
        with self._wakeup:
            return [h.task_id for s in self._settlements for h in s.claims]

    def held_count(self) -> int:
        with self._wakeup:
            return len(self._held)

    def stop(self, timeout: float = 5.0) -> None:
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        self.join(timeout)

    # -- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            with self._wakeup:
                if self._stopping:
                    break
                self._wakeup.wait(self._next_wait())
                if self._stopping:
                    break
            self.settle_pending()
            self.renew_due()
        # One last pass: claims released at shutdown should not wait for their leases.
        self.settle_pending()
        self._db.close()

    def _next_wait(self) -> float:
        now = time.monotonic()
        times = [now + self.renew_interval]
        times += [h.due for h in self._held.values()]
        if self._settlements:
            times.append(self._settle_at)
        return max(0.0, min(times) - now)

    def _deadline(self, renew_interval: float) -> float:
        return max(1.0, min(MAX_STATEMENT_SECONDS, renew_interval))

    # -- renewals ----------------------------------------------------------------------------

    def renew_due(self) -> None:
        now = time.monotonic()
        with self._wakeup:
            due = [h for h in self._held.values()
                   if h.due <= now + h.renew_interval * GROUPING]
        due = [h for h in due if h.holder.alive()]
        # One statement per lease length: during a reload that changes it there are two.
        by_lease: dict[float, list[Held]] = {}
        for held in due:
            by_lease.setdefault(held.lease_seconds, []).append(held)
        for lease_seconds, claims in by_lease.items():
            self._renew(claims, lease_seconds)

    def _renew(self, due: list[Held], lease_seconds: float) -> None:
        sent_at = time.monotonic()
        try:
            conn = self._db.get()
            with within(conn, self._deadline(min(h.renew_interval for h in due))):
                renewed = store.renew_leases(conn, [h.claim() for h in due],
                                             lease_seconds=lease_seconds)
                lost = [h for h in due if h.token not in renewed]
                states = store.claim_states(conn, [h.task_id for h in lost]) if lost else {}
        except (psycopg.Error, OperationalError) as exc:
            self._db.close()
            self._renew_failed(exc, due)
            return
        if self._renew_failing:
            self._renew_failing = False
            emit("lease_renew_recovered")
        # The database started the lease at its now(), no earlier than sent_at: this is the
        # end the holder may count on, never later than the one written.
        expires_at = sent_at + lease_seconds
        by_holder: dict[int, tuple[Holder, list[int]]] = {}
        with self._wakeup:
            for held in due:
                if held.token in renewed and self._held.get(held.token) is held:
                    held.due = sent_at + held.renew_interval
                    by_holder.setdefault(id(held.holder), (held.holder, []))[1].append(held.token)
            for held in lost:
                if self._held.get(held.token) is held:
                    del self._held[held.token]
                    self._lost[held.token] = held
        for holder, tokens in by_holder.values():
            holder.renewed(tokens, expires_at)
        for held in due:
            if held.token in renewed:
                metrics.LEASE_RENEWALS.labels(held.pool, held.task_type).inc()
                emit("lease_renewed", task_id=held.task_id, worker_id=held.worker_id,
                     task_type=held.task_type, pool=held.pool)
        for held in lost:
            self._tell_lost(held, states.get(held.task_id))

    def _renew_failed(self, exc: BaseException, due: list[Held]) -> None:
        # Try again soon: a lease has lease.seconds to live, and the next try may connect.
        now = time.monotonic()
        with self._wakeup:
            for held in due:
                held.due = now + renew_retry_delay(held.renew_interval)
        if not self._renew_failing:
            self._renew_failing = True
            emit("lease_renew_failed", logging.WARNING, error=one_line(exc),
                 claims=len(due))

    def _tell_lost(self, held: Held, state: dict | None) -> None:
        if state and state["lease_token"] == held.token and state["status"] != "RUNNING":
            # The owner's own final write, reported to us later than it landed: not a loss.
            return
        status = state["status"] if state else "DELETED"
        fields = dict(task_id=held.task_id, worker_id=held.worker_id,
                      task_type=held.task_type, pool=held.pool)
        if status == "CANCELLED":
            reason = "cancelled"
            emit("task_cancelled", while_running=True, **fields)
            self.on_cancelled(held.task_id)
        else:
            reason = f"lease lost (task is now {status})"
            emit("lease_lost", logging.WARNING, status=status, **fields)
        held.holder.lost(held.token, reason)

    # -- settling ----------------------------------------------------------------------------

    def settle_pending(self) -> None:
        with self._wakeup:
            if not self._settlements or time.monotonic() < self._settle_at:
                return
        while True:
            with self._wakeup:
                if not self._settlements:
                    break
                settlement = self._settlements[0]
            try:
                conn = self._db.get()
                with within(conn, self._deadline(self.renew_interval)):
                    self._settle_one(conn, settlement)
            except _StillRunning:
                # Behind the others: they need not wait for it.
                with self._wakeup:
                    self._settlements.rotate(-1)
                    self._settle_at = time.monotonic() + UNHEARD_RECHECK
                return
            except (psycopg.Error, OperationalError) as exc:
                self._db.close()
                self._settle_failures += 1
                delay = min(2.0 ** self._settle_failures, SETTLE_MAX_BACKOFF)
                with self._wakeup:
                    self._settle_at = time.monotonic() + delay
                # The lease will expire and a reaper will settle it if we never can. The
                # first line is the error itself; later ones are context.
                # A settlement of claims a dead child never reported names none yet.
                emit("rescue_deferred", logging.WARNING,
                     task_id=settlement.claims[0].task_id if settlement.claims else None,
                     worker_id=settlement.unheard.worker_id if settlement.unheard else None,
                     tasks=len(settlement.claims),
                     error=str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc),
                     retry_in=round(delay, 1))
                return
            with self._wakeup:
                self._settlements.popleft()
            self._settle_failures = 0

    def _settle_one(self, conn, settlement: Settlement) -> None:
        if settlement.kind == "unheard":
            self._settle_unheard(conn, settlement)
            return
        if settlement.kind == "release":
            released = store.release_tasks(conn, [(h.task_id, h.token) for h in settlement.claims])
            for held in settlement.claims:
                emit("task_released", task_id=held.task_id, task_type=held.task_type,
                     released=held.task_id in released, pool=held.pool)
            unsettled = [h for h in settlement.claims if h.task_id not in released]
        elif settlement.kind == "complete":
            unsettled = self._complete(conn, settlement.claims)
        else:
            unsettled = [held for held in settlement.claims
                         if not self._rescue(conn, held, settlement)]
        # Lost before their holder died (a cancel): their runs are over now, and so is the
        # hold on the slot the cancel left them.
        store.end_lost_claims(conn, [(h.task_id, h.token) for h in unsettled])

    def _settle_unheard(self, conn, settlement: Settlement) -> None:
        from .claim_board import FINISHED, STARTED

        unheard = settlement.unheard
        # Its backend may still run the claim it was killed in, or one already sent, and commit
        # it after we looked: wait for the backend to be gone, but not past half the lease
        # (the reaper would charge them).
        waited = time.monotonic() - unheard.died_at
        if store.statements_still_running(conn, worker_application_name(unheard.worker_id),
                                          pooled=self._db.pooled):
            if waited < max(1.0, unheard.lease_seconds / 2):
                raise _StillRunning
            emit("unheard_claims_still_running", logging.WARNING, worker_id=unheard.worker_id,
                 pool=unheard.pool, waited_seconds=round(waited, 1))
        rows = store.unheard_claims(conn, unheard.worker_id,
                                    died_seconds_ago=time.monotonic() - unheard.died_at,
                                    known_tokens=sorted(unheard.known_tokens))
        if not rows:
            return
        by_kind: dict[str, list[Held]] = {"complete": [], "release": [], unheard.running_kind: []}
        for row in rows:
            held = Held(row["id"], int(row["lease_token"]), row["task_type"], unheard.worker_id,
                        unheard.pool, unheard.holder, unheard.lease_seconds,
                        unheard.renew_interval)
            state = unheard.states.get(held.token)
            kind = ("complete" if state == FINISHED else
                    unheard.running_kind if state == STARTED else "release")
            by_kind[kind].append(held)
        emit("unheard_claims", logging.WARNING, worker_id=unheard.worker_id, pool=unheard.pool,
             tasks=len(rows), task_ids=[r["id"] for r in rows[:20]],
             **{k: len(v) for k, v in by_kind.items()})
        for kind, claims in by_kind.items():
            if claims:
                self._settle_one(conn, Settlement(kind, tuple(claims), settlement.reason,
                                                  outcome=settlement.outcome,
                                                  signal=settlement.signal))

    def _complete(self, conn, claims: Sequence[Held]) -> list[Held]:
        """Write these completions; the claims whose write changed nothing."""
        # One statement per worker id: the completion is conditioned on each claim's owner.
        unsettled = []
        by_worker: dict[str, list[Held]] = {}
        for held in claims:
            by_worker.setdefault(held.worker_id, []).append(held)
        for worker_claims in by_worker.values():
            landed = store.complete_tasks(conn, [h.claim() for h in worker_claims])
            for held in worker_claims:
                if held.token not in landed:
                    emit("rescue_skipped", task_id=held.task_id, task_type=held.task_type,
                         reason="the claim was already settled or lost")
                    unsettled.append(held)
                    continue
                metrics.TASKS_COMPLETED.labels(held.pool, held.task_type).inc()
                emit("task_completed", task_id=held.task_id, task_type=held.task_type,
                     worker_id=held.worker_id, pool=held.pool, written_by="supervisor")
        return unsettled

    def _rescue(self, conn, held: Held, settlement: Settlement) -> bool:
        """Count the dead child's run as a failed attempt (recorded with how it ended);
        False if the claim had ended."""
        reason = settlement.reason
        row = store.rescue_task(conn, held.task_id, held.token, error=reason, retry=self.retry,
                                worker_id=held.worker_id, outcome=settlement.outcome,
                                signal=settlement.signal)
        if row is None:
            emit("rescue_skipped", task_id=held.task_id, task_type=held.task_type,
                 reason="the claim was already settled or lost")
            return False
        metrics.TASKS_RESCUED.labels(held.pool, held.task_type).inc()
        if row["status"] == "FAILED":
            metrics.TASKS_FAILED.labels(held.pool, held.task_type).inc()
            emit("task_failed", logging.ERROR, task_id=row["id"], task_type=held.task_type,
                 retry_count=row["retry_count"], error=reason, rescued=True, pool=held.pool)
        else:
            metrics.TASKS_RETRIED.labels(held.pool, held.task_type).inc()
            emit("task_retry_scheduled", logging.WARNING, task_id=row["id"],
                 task_type=held.task_type, retry_count=row["retry_count"],
                 retry_delay=round(row["retry_delay"], 3), error=reason, rescued=True,
                 pool=held.pool)
        return True
