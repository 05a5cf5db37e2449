"""One function per named query: the only way the rest of pgtaskd touches the tasks table.

Each function takes an open psycopg connection (autocommit, or inside the caller's
transaction) and returns plain dicts or values, so the worker loop, the reaper and the client
never see SQL.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Iterator, Sequence

import psycopg
from psycopg.types.json import Json, Jsonb

from ..config import FINISHED_STATUSES, MAX_LIMIT, MAX_SECONDS, RetryConfig
from .loaders import TimeLoader, TimeOrNone, TimeOrText, cursor
from .queries import QUERIES
# The queue's figures for the health check and stats (re-exported: callers use store.*).
from .queue_figures import live_counts, queue_by_type, queue_health  # noqa: F401


@dataclass(frozen=True)
class Claim:
    """Who owns a task: the fencing token is what makes an owner's later writes safe."""
    task_id: str
    worker_id: str
    token: int


def _one(conn: psycopg.Connection, name: str, params: dict[str, Any], *,
         times: TimeLoader = None) -> dict | None:
    with cursor(conn, times=times) as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchone()


def _all(conn: psycopg.Connection, name: str, params: dict[str, Any], *,
         times: TimeLoader = None) -> list[dict]:
    with cursor(conn, times=times) as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchall()


def _backoff(retry: RetryConfig) -> dict[str, float]:
    return {"base_delay": retry.base_delay, "max_delay": retry.max_delay, "jitter": retry.jitter}


# Connections whose last claim found a global limit on one of its worker's types: their next
# claim goes through complete_and_claim_limited. A connection not seen yet starts there too,
# and learns from its first answer.
_LIMITED: weakref.WeakKeyDictionary[psycopg.Connection, bool] = weakref.WeakKeyDictionary()


def complete_and_claim(conn, completions: Sequence[Claim], *, worker_id: str,
                       task_types: Iterable[str], lease_seconds: float, limit: int,
                       usage: Sequence[tuple[float | None, int | None]] | None = None
                       ) -> tuple[set[int], list[dict]]:
    """Record these completions (all of ``worker_id``) and claim up to ``limit`` due tasks
    of these types, in one transaction: the tokens whose completion landed, and the claimed
    rows in the order to run them, each with ``payload`` as JSON text (the caller decodes
    it) and its own ``lease_token``. ``usage``, one (CPU seconds, peak RSS bytes) per
    completion, is recorded with it.

    Tasks of a type with a global limit are claimed only through the limit's slots
    (complete_and_claim_limited). Without limits the plain statement is a fifth cheaper, so
    it is the one used while the last claim on this connection said no limit binds its
    types; when a limit appears, the plain statement claims nothing (it would take tasks of
    other types ahead of the limited type's more urgent ones) and says so, and the limited
    statement claims in its place at once.
    """
    task_types = list(task_types)
    usage = usage or [(None, None)] * len(completions)
    params = {
        "worker_id": worker_id, "done_ids": [c.task_id for c in completions],
        "done_tokens": [c.token for c in completions],
        "done_cpu": [u[0] for u in usage], "done_rss": [u[1] for u in usage],
        "task_types": task_types, "lease_seconds": lease_seconds, "limit": limit}
    limited = _LIMITED.get(conn, True)
    landed, claimed, signals, kept = _complete_and_claim(conn, limited, params)
    # Completed claims whose slots the statement could not see (given to their tasks by a
    # limit's setter it waited for): given back now that they are in view.
    end_lost_claims(conn, kept)
    limits_bind = "limited" in signals
    # An answer to no types (a completion written alone) says nothing about limits: keeping
    # it would send the next claim through the plain statement (issue 14.6).
    if task_types:
        _LIMITED[conn] = limits_bind
    # Asked again, once, when the claim came up short and either a limit binds that the
    # plain statement may not claim under, or staging found due tasks of these types (a
    # worker woken for a task whose time came would otherwise wait a poll for it).
    staged_due = task_types and _stage_if_due(conn, task_types, short=len(claimed) < limit)
    if len(claimed) < limit and ((limits_bind and not limited) or staged_due):
        _, more, _, _ = _complete_and_claim(conn, limits_bind, {
            **params, "done_ids": [], "done_tokens": [], "done_cpu": [], "done_rss": [],
            "limit": limit - len(claimed)})
        claimed += more
    return landed, claimed


# When each connection last staged (time.monotonic()): a connection whose claims come back
# full stages this often, so that on a busy queue a task is staged well within the staging
# lead (1 s) before its time.
STAGE_EVERY = 0.25
_STAGED_AT: weakref.WeakKeyDictionary[psycopg.Connection, float] = weakref.WeakKeyDictionary()


def _stage_if_due(conn, task_types: list[str], *, short: bool) -> bool:
    """Stage what is due or near (stage_tasks) when a claim came up short or a quarter second
    passed; whether due tasks of these types were staged."""
    now = time.monotonic()
    if not short and now - _STAGED_AT.get(conn, 0.0) < STAGE_EVERY:
        return False
    _STAGED_AT[conn] = now
    return stage_tasks(conn, task_types)["due_for_types"] > 0


def stage_tasks(conn, task_types: Sequence[str] = ()) -> dict:
    """{staged, due_for_types}: see stage_tasks in queries.sql."""
    return _one(conn, "stage_tasks", {"task_types": list(task_types)})


def _complete_and_claim(conn, limited: bool, params: dict
                        ) -> tuple[set[int], list[dict], set, list[tuple[str, int]]]:
    rows = _all(conn, "complete_and_claim_limited" if limited else "complete_and_claim", params,
                times=TimeOrNone)
    landed = {row["lease_token"] for row in rows if row["completed"]}
    claimed = sorted((row for row in rows if row["completed"] is False),
                     key=lambda r: r["position"])
    kept = [(row["id"], row["lease_token"]) for row in rows if row["signal"] == "kept"]
    return (landed, claimed, {row["signal"] for row in rows if row["completed"] is None},
            kept)


def claim_tasks(conn, *, worker_id: str, task_types: Iterable[str], lease_seconds: float,
                limit: int = 1) -> list[dict]:
    """Claim up to ``limit`` due tasks of these types, in the order to run them."""
    return complete_and_claim(conn, (), worker_id=worker_id, task_types=task_types,
                              lease_seconds=lease_seconds, limit=limit)[1]


def claim_task(conn, *, worker_id: str, task_types: Iterable[str],
               lease_seconds: float) -> dict | None:
    """Claim the most urgent due task of these types and return its whole row, or None:
    the seed's one-at-a-time claim, for tools and tests (the worker uses claim_tasks)."""
    rows = claim_tasks(conn, worker_id=worker_id, task_types=task_types,
                       lease_seconds=lease_seconds, limit=1)
    return get_task(conn, rows[0]["id"]) if rows else None


def complete_tasks(conn, claims: Sequence[Claim],
                   usage: Sequence[tuple[float | None, int | None]] | None = None) -> set[int]:
    """Mark these claims COMPLETED (all of one worker); the tokens whose write landed."""
    if not claims:
        return set()
    return complete_and_claim(conn, claims, worker_id=claims[0].worker_id, task_types=(),
                              lease_seconds=0, limit=0, usage=usage)[0]


def complete_task(conn, claim: Claim) -> bool:
    return claim.token in complete_tasks(conn, [claim])


def renew_leases(conn, claims: Sequence[Claim], *, lease_seconds: float) -> set[int]:
    """Extend these leases in one statement; the tokens of those still held."""
    rows = _all(conn, "renew_leases", {
        "ids": [c.task_id for c in claims], "tokens": [c.token for c in claims],
        "workers": [c.worker_id for c in claims], "lease_seconds": lease_seconds})
    return {row["lease_token"] for row in rows}


def renew_lease(conn, claim: Claim, *, lease_seconds: float) -> bool:
    """Extend one lease; False means the claim is lost (cancelled, or taken over)."""
    return claim.token in renew_leases(conn, [claim], lease_seconds=lease_seconds)


def claim_states(conn, task_ids: Iterable[str]) -> dict[str, dict]:
    """task id -> {status, lease_token} of those that still exist."""
    return {row["id"]: row for row in _all(conn, "claim_states", {"ids": list(task_ids)})}


@dataclass(frozen=True)
class Failure:
    """How a failed run ended, for the task's failed attempts (task_attempts): ``outcome``
    is one of OUTCOMES; the rest as the worker or the supervisor knows them."""
    outcome: str
    error_type: str | None = None
    message: str | None = None
    traceback: str | None = None


# How a failed run may end (task_attempts.outcome; migration 0012 says what each means).
OUTCOMES = ("exception", "permanent", "timeout", "killed", "crashed", "lease_lost")


def fail_attempt(conn, claim: Claim, *, error: str, permanent: bool, retry: RetryConfig,
                 cpu_seconds: float | None = None, peak_rss_bytes: int | None = None,
                 failure: Failure | None = None) -> dict | None:
    """Record a failed run, and ``failure`` in the task's failed attempts (by default, an
    exception known only by ``error``). Returns {status, retry_count, retry_delay}, or None
    if not ours."""
    failure = failure or Failure("permanent" if permanent else "exception", message=error)
    return _kept_given_back(conn, [(claim.task_id, claim.token)], _one(conn, "fail_attempt", {
        "task_id": claim.task_id, "worker_id": claim.worker_id, "token": claim.token,
        "error": error, "permanent": permanent, "cpu_seconds": cpu_seconds,
        "peak_rss_bytes": peak_rss_bytes, "outcome": failure.outcome,
        "error_type": failure.error_type, "message": failure.message,
        "traceback": failure.traceback, **_backoff(retry)}))


def _kept_given_back(conn, claims: Sequence[tuple[str, int]], row: dict | None) -> dict | None:
    """A run ended by one statement whose slot it could not see (``slot_kept``: given to
    its task by a limit's setter it waited for) gives it back now that it is in view."""
    if row is not None and row.pop("slot_kept"):
        end_lost_claims(conn, claims)
    return row


def statements_still_running(conn, application_name: str, *, pooled: bool) -> int:
    """How many backends named ``application_name`` may still commit a statement (through a
    transaction pooler: how many run one)."""
    return int(_one(conn, "statements_still_running",
                    {"name": application_name, "pooled": pooled})["running"])


def unheard_claims(conn, worker_id: str, *, died_seconds_ago: float,
                   known_tokens: Sequence[int], limit: int = 10_000) -> list[dict]:
    """{id, lease_token, task_type} of the RUNNING tasks ``worker_id`` claimed before it died
    ``died_seconds_ago`` and whose tokens are not among ``known_tokens``."""
    return _all(conn, "unheard_claims", {"worker_id": worker_id,
                                         "died_seconds_ago": max(0.0, died_seconds_ago),
                                         "known_tokens": list(known_tokens), "limit": limit})


def release_tasks(conn, claims: Sequence[tuple[str, int]]) -> set[str]:
    """Back to PENDING without spending a retry; the ids released. ``claims`` are
    (task_id, token) pairs."""
    if not claims:
        return set()
    rows = _all(conn, "release_tasks", {"ids": [c[0] for c in claims],
                                        "tokens": [c[1] for c in claims]})
    released = {row["id"] for row in rows}
    kept = {row["id"] for row in rows if row["slot_kept"]}
    # Slots the statement could not see (given to their tasks by a limit's setter it
    # waited for): given back now that they are in view.
    end_lost_claims(conn, [c for c in claims if c[0] in kept])
    return released


def release_task(conn, task_id: str, token: int) -> bool:
    """Back to PENDING without spending a retry (a stopping daemon, not a failing task)."""
    return bool(release_tasks(conn, [(task_id, token)]))


def rescue_task(conn, task_id: str, token: int, *, error: str, retry: RetryConfig,
                worker_id: str | None = None, outcome: str = "crashed",
                signal: str | None = None) -> dict | None:
    """A dead child's claim counts as a failed attempt now rather than at lease expiry,
    recorded with how the child ended (``outcome``, the ``signal`` that killed it) and the
    ``worker_id`` it had."""
    return _kept_given_back(conn, [(task_id, token)], _one(conn, "rescue_task", {
        "task_id": task_id, "token": token, "error": error, "worker_id": worker_id,
        "outcome": outcome, "signal": signal, **_backoff(retry)}))


def reap_expired_leases(conn, *, batch_size: int, retry: RetryConfig) -> list[dict]:
    return _all(conn, "reap_expired_leases", {"batch_size": batch_size, **_backoff(retry)})


def delete_finished_tasks(conn, *, status: str, older_than_seconds: float,
                          batch_size: int) -> int:
    """Delete up to ``batch_size`` tasks of this finished status that finished more than
    ``older_than_seconds`` ago; how many were deleted. Rows another session holds locked
    are skipped, not waited for."""
    if status not in FINISHED_STATUSES:
        raise ValueError(f"retention deletes only finished tasks, not {status!r}")
    with conn.cursor() as cur:
        cur.execute(QUERIES["delete_finished_tasks"], {
            "status": status, "older_than_seconds": older_than_seconds,
            "batch_size": batch_size})
        return cur.rowcount


def cancel_task(conn, task_id: str) -> bool:
    """True if the task was PENDING or RUNNING and is now CANCELLED. A RUNNING task's slot
    (a limited type) stays held until its run is over (end_lost_claims)."""
    return _one(conn, "cancel_task", {"task_id": task_id}) is not None


def end_lost_claims(conn, claims: Sequence[tuple[str, int]]) -> dict[str, dict]:
    """The runs of these lost claims ((task_id, token) pairs) are over: give back the slots
    still held under them (a claim cancelled while it ran). task id -> {status, lease_token}
    of those tasks that still exist, as task_status reads them."""
    if not claims:
        return {}
    rows = _all(conn, "end_lost_claims", {"ids": [c[0] for c in claims],
                                          "tokens": [c[1] for c in claims]})
    return {row["id"]: row for row in rows}


def get_task(conn, task_id: str) -> dict | None:
    return _one(conn, "get_task", {"task_id": task_id}, times=TimeOrText)


def failed_attempts(conn, task_id: str, *, limit: int) -> list[dict]:
    """The newest ``limit`` failed attempts of a task, oldest first: {attempt, outcome,
    worker_id, started_at, ended_at, error_type, message, signal, traceback}."""
    return _all(conn, "failed_attempts", {"task_id": task_id, "limit": limit},
                times=TimeOrText)


def task_status(conn, task_id: str) -> dict | None:
    return _one(conn, "task_status", {"task_id": task_id})


def insert_task(conn, *, task_id: str, name: str, task_type: str, payload: dict,
                priority: int = 0, scheduled_time=None, max_retries: int = 3) -> bool:
    """Insert a PENDING task; False if a task with this id exists already (nothing written)."""
    return _one(conn, "insert_task", {
        "id": task_id, "name": name, "task_type": task_type, "payload": Jsonb(payload),
        "priority": priority, "scheduled_time": scheduled_time, "max_retries": max_retries,
    }) is not None


def count_by_status(conn) -> dict[str, int]:
    """Exact counts of every status present; reads the whole table."""
    return {row["status"]: row["count"] for row in _all(conn, "count_by_status", {})}


def submit_tasks(conn, tasks_json: str) -> set[tuple[str, str | None]]:
    """Insert PENDING tasks from a JSON array of objects with ``id, name, task_type,
    payload, priority, run_at, delay_seconds, max_retries, unique_key``.

    Returns (id, unique_key) of each task this call created; a task missing from the result
    found its id taken, or its unique key held by a PENDING or RUNNING task.
    """
    return {(row["id"], row["unique_key"])
            for row in _all(conn, "submit_tasks", {"tasks": tasks_json})}


def find_submitted(conn, *, ids: Sequence[str],
                   keys: Sequence[str]) -> tuple[set[str], dict[str, str]]:
    """Which of these ids exist (any status), and unique key -> the id of the PENDING or
    RUNNING task that holds it, for those of these keys that are held."""
    existing, holders = set(), {}
    for row in _all(conn, "find_submitted", {"ids": list(ids), "keys": list(keys)}):
        if row["unique_key"] is None:
            existing.add(row["id"])
        else:
            holders[row["unique_key"]] = row["id"]
    return existing, holders


def retry_task(conn, task_id: str) -> bool:
    """True if the task was FAILED or CANCELLED and is PENDING again; False if it is in
    another status, missing, or its unique key is held by a live task (unique_key_holder
    names it)."""
    try:
        with _savepoint(conn):
            return _one(conn, "retry_task", {"task_id": task_id}) is not None
    except psycopg.errors.UniqueViolation:
        # A submit of the same key committed after the statement's snapshot: the index
        # refused the row. Only the savepoint was undone, unless there was none to undo.
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
            raise
        return False


def unique_key_holder(conn, task_id: str) -> dict | None:
    """{id, status, unique_key} of the live task, other than this one, holding this task's
    unique key; None when no other task holds it."""
    return _one(conn, "unique_key_holder", {"task_id": task_id})


# How often a bulk retry's batch runs again after a unique key was taken under it: each run
# sees the keys committed before it, so a second run fails only if yet another submit of one
# of its keys committed in between.
MAX_RETRY_BATCH_RUNS = 5


def bulk_window(conn, *, since_at: datetime | None = None, since_seconds: float | None = None,
                before_at: datetime | None = None,
                before_seconds: float | None = None) -> tuple[str, str]:
    """(since, before) of a bulk action as PostgreSQL's text, fixed now: a time given, or so
    many seconds before the database's clock; before is never later than now."""
    row = _one(conn, "bulk_window", {"since_at": since_at, "since_seconds": since_seconds,
                                     "before_at": before_at, "before_seconds": before_seconds})
    return row["since"], row["before"]


def walk_start(window: tuple[str, str]) -> tuple[str, str]:
    """The position before a walk's first row: the window's start, with an empty id, which
    sorts before any other (a row at exactly that instant with an empty id is the only one
    missed, and pgtaskd never writes an empty id). The start is the window's and not
    -infinity so that the keyset condition begins the index range where the window does:
    PostgreSQL starts the scan at the keyset's bound, not the time's."""
    return window[0], ""


def next_task_type(conn, *, status: str, after: str | None) -> str | None:
    """The first task type after ``after`` (None: the first) with tasks in this status."""
    name = "next_pending_type" if status == "PENDING" else "next_finished_type"
    return _one(conn, name, {"status": status, "after": after})["task_type"]


def scan_tasks(conn, *, status: str, task_type: str, window: tuple[str, str],
               after: tuple[str, str], limit: int, matching: dict[str, str | None],
               with_holders: bool = False) -> list[dict]:
    """One batch of a bulk action, read without locking: up to ``limit`` tasks of this status
    and type in the window, after the position ``after`` (walk_start(window) for the first
    batch, then the last row's (position, id)), in the walk's order: {id, position,
    unique_key, wanted (matches
    ``matching``: error, id_prefix, name_prefix, unique_key), key_held (only asked for
    ``with_holders``)}. PENDING walks by created_at, a finished status by finished_at."""
    name = "scan_pending_tasks" if status == "PENDING" else "scan_finished_tasks"
    return _all(conn, name, {
        "status": status, "task_type": task_type, "since": window[0], "before": window[1],
        "after_position": after[0], "after_id": after[1], "limit": limit,
        "with_holders": with_holders, **matching})


def retry_scanned(conn, ids: Sequence[str], *, status: str,
                  window: tuple[str, str]) -> tuple[int, int]:
    """Retry these tasks if they are still ``status`` and in the window: (retried, refused
    because a live task holds the unique key). Rows locked by another session are left."""
    params = {"ids": list(ids), "status": status, "since": window[0], "before": window[1]}
    runs = 1
    while True:
        try:
            with _savepoint(conn):
                row = _one(conn, "retry_scanned", params)
            return row["changed"], row["refused"]
        except psycopg.errors.UniqueViolation:
            # As in retry_task: a submit of one of these keys committed after the snapshot.
            # Only the savepoint was undone (or the statement, in autocommit).
            if (conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
                    or runs == MAX_RETRY_BATCH_RUNS):
                raise
            runs += 1


def cancel_scanned(conn, ids: Sequence[str], *, window: tuple[str, str]) -> int:
    """Cancel these tasks if they are still PENDING and in the window; how many were."""
    with conn.cursor() as cur:
        cur.execute(QUERIES["cancel_scanned"], {"ids": list(ids), "since": window[0],
                                                "before": window[1]})
        return cur.rowcount


def purge_scanned(conn, ids: Sequence[str], *, status: str, window: tuple[str, str]) -> int:
    """Delete these tasks if they are still ``status`` and in the window; how many were."""
    with conn.cursor() as cur:
        cur.execute(QUERIES["purge_scanned"], {"ids": list(ids), "status": status,
                                               "since": window[0], "before": window[1]})
        return cur.rowcount


@contextlib.contextmanager
def _savepoint(conn) -> Iterator[None]:
    """Inside an open transaction, a savepoint: a statement the database refuses then undoes
    only itself, not the caller's transaction. Outside one, nothing: an autocommit statement
    undoes only itself anyway, and on a connection without autocommit psycopg's transaction()
    would commit what it opened, which this module never does to a caller's connection."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        with conn.transaction():
            yield
    else:
        yield


def pause_task_type(conn, task_type: str, *, paused_by: str | None) -> dict | None:
    """Pause a task type for every daemon; {task_type, paused_at, paused_by}, or None when it
    was paused already (that pause is left as it was)."""
    return _one(conn, "pause_task_type", {"task_type": task_type, "paused_by": paused_by})


def resume_task_type(conn, task_type: str) -> dict | None:
    """Resume a paused task type and wake idle workers if any of its tasks are due;
    {task_type, paused_at, paused_by, due (counted up to 1000), notified}, or None when it
    was not paused."""
    return _one(conn, "resume_task_type", {"task_type": task_type})


def list_pauses(conn, *, cap: int = 10_000) -> list[dict]:
    """The paused task types: {task_type, paused_at, paused_by, due_pending}, by type;
    due_pending stops at cap + 1 (meaning more than cap)."""
    return _all(conn, "list_pauses", {"cap": cap})


def set_task_type_limit(conn, task_type: str, max_running: int, *,
                        updated_by: str | None, from_claims: bool = False) -> dict:
    """Set the global concurrency limit of a task type: {task_type, max_running, previous
    (None if it had none), changed, notified (idle workers woken for a raised limit)}.
    ``from_claims``: the limit is the daemons' smallest claim, not an operator's value.
    Its slots are rebuilt from the RUNNING tasks in the same transaction (repair_limit_slots,
    then adopt_running_tasks: a task running without a slot takes one): setting a limit
    never makes a second place for a task that runs, and every running task counts."""
    with _atomic(conn):
        row = _one(conn, "set_task_type_limit", {"task_type": task_type,
                                                 "max_running": max_running,
                                                 "updated_by": updated_by,
                                                 "from_claims": from_claims})
        repair_limit_slots(conn, [task_type])
        _adopt_running_tasks(conn, task_type)
    return row


# adopt_running_tasks locks the running tasks' rows by id; a batch's end locks its own in
# the order its plan reads them, so the two can wait for each other in a cycle. The setter
# waits this long for a row, then lets go of the rows it holds (its savepoint) and starts
# again: a cycle costs the worker a moment, never its statement (PostgreSQL would abort one
# of the two after deadlock_timeout, 1 s by default, and the worker's as likely as not).
ADOPT_LOCK_WAIT = "100ms"
ADOPT_TRIES = 20


def _adopt_running_tasks(conn, task_type: str) -> None:
    params = {"task_type": task_type, "max_limit": MAX_LIMIT}
    for _ in range(ADOPT_TRIES):
        try:
            with conn.transaction():
                bound = _one(conn, "bound_lock_waits", {"lock_timeout": ADOPT_LOCK_WAIT})
                _one(conn, "adopt_running_tasks", params)
                _one(conn, "bound_lock_waits", {"lock_timeout": bound["previous"]})
            return
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            continue
    # A row held this long is not an end's (a session holds it): wait for it.
    _one(conn, "adopt_running_tasks", params)


def repair_limit_slots(conn, task_types: Sequence[str] | None = None) -> dict:
    """Make the slot rows of these types (None: all) agree with the tasks: free those whose
    claim ended or is gone, bound each held one's lease by its task's, recreate missing ones
    (held by the RUNNING task that names them, if any). {freed, bounded, restored_held,
    restored_free}: how many rows each way."""
    return _one(conn, "repair_limit_slots", {
        "task_types": None if task_types is None else list(task_types),
        "max_limit": MAX_LIMIT, "max_lease_seconds": MAX_SECONDS})


@contextlib.contextmanager
def _atomic(conn) -> Iterator[None]:
    """Several statements as one transaction: on an idle autocommit connection, a transaction
    of their own; otherwise the caller's (or the one the first statement opens, which the
    caller commits), never committed here."""
    if conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        with conn.transaction():
            yield
    else:
        yield


def remove_task_type_limit(conn, task_type: str, *, with_claims: bool = True) -> dict | None:
    """Remove a task type's global limit (and, ``with_claims``, every daemon's claim on it):
    {task_type, max_running, notified}, or None when it had none."""
    return _one(conn, "remove_task_type_limit", {"task_type": task_type,
                                                 "with_claims": with_claims})


def list_limits(conn) -> list[dict]:
    """The global concurrency limits: {task_type, max_running, updated_at, updated_by,
    running, from_claims, claims}, by type."""
    return _all(conn, "list_limits", {})


def claim_limit(conn, task_type: str, daemon: str, max_running: int | None) -> dict:
    """Set (or with None, drop) this daemon's claim on a type's limit, under the type's lock
    for the rest of the transaction: {max_running (the smallest claim, None if none),
    daemon (its holder), from_claims (None: no limit in force)}."""
    params = {"task_type": task_type, "daemon": daemon, "max_running": max_running,
              "max_limit": MAX_LIMIT}
    _one(conn, "lock_limit_claims", params)
    with conn.cursor() as cur:
        cur.execute(QUERIES["drop_limit_claim" if max_running is None else "set_limit_claim"],
                    params)
    return _one(conn, "limit_claims_of", params)


def claimed_limit_types(conn, daemon: str) -> list[str]:
    return [row["task_type"] for row in _all(conn, "claimed_limit_types", {"daemon": daemon})]


def list_tasks(conn, *, status: str | None, task_type: str | None, limit: int) -> list[dict]:
    return _all(conn, "list_tasks", {"status": status, "task_type": task_type, "limit": limit},
                times=TimeOrText)


def count_by_type_and_status(conn) -> list[dict]:
    """Rows of {task_type, status, count}, only for pairs that have tasks; reads every row."""
    return _all(conn, "count_by_type_and_status", {})


def tasks_schema(conn) -> str:
    """The schema of the ``tasks`` table this connection uses."""
    return _one(conn, "tasks_schema", {})["schema"]


def database_now(conn) -> datetime:
    """The database's clock (the transaction's start, inside a transaction)."""
    return _one(conn, "database_now", {})["now"]


def heartbeat_daemon(conn, *, daemon_id: str, daemon: str, host: str, pid: int, version: str,
                     config_path: str | None, interval: float, generation: int, state: str,
                     pools: dict) -> bool:
    """Write this daemon's registry row, in one statement; True when it created the row."""
    return _one(conn, "heartbeat_daemon", {
        "id": daemon_id, "daemon": daemon, "host": host, "pid": pid, "version": version,
        "config_path": config_path, "interval": interval, "generation": generation,
        "state": state, "pools": Json(pools)})["registered"]


def sign_off_daemon(conn, daemon_id: str) -> bool:
    """Mark this daemon's row stopped; False when it has none."""
    with conn.cursor() as cur:
        cur.execute(QUERIES["sign_off_daemon"], {"id": daemon_id})
        return cur.rowcount == 1


def prune_daemons(conn, *, older_than_seconds: float) -> int:
    """Delete the rows of daemons silent for this long; how many."""
    with conn.cursor() as cur:
        cur.execute(QUERIES["prune_daemons"], {"older_than": older_than_seconds})
        return cur.rowcount


def list_daemons(conn, *, state: str | None, limit: int, lost_beats: float,
                 lost_floor: float) -> list[dict]:
    """The registry's rows (see list_daemons in queries.sql), running daemons first."""
    return _all(conn, "list_daemons", {"state": state, "limit": limit,
                                       "lost_beats": lost_beats, "lost_floor": lost_floor})


# The web console's reads (pgtaskd web) and the rollup they chart. Each runs unprepared
# (prepare=False): their optional filters are `%(x)s IS NULL OR ...`, which a plan made
# for the values at hand drops, and a generic plan, made once for any values, cannot.

def _unprepared(conn, name: str, params: dict[str, Any], *,
                times: TimeLoader = TimeOrText) -> list[dict]:
    with cursor(conn, times=times) as cur:
        cur.execute(QUERIES[name], params, prepare=False)
        return cur.fetchall()


def rollup_minutes(conn, *, cap: int, catch_up: int, max_types: int) -> dict:
    """Roll up the complete minutes of the last ``catch_up`` that no daemon rolled up yet:
    {minutes_written, into_minute (seconds since this minute began, by the database)}."""
    return _one(conn, "rollup_minutes", {"cap": cap, "catch_up": catch_up,
                                         "max_types": max_types})


def console_overview(conn, *, known_types: Sequence[str], cap: int, max_types: int,
                     max_levels: int) -> list[dict]:
    return _unprepared(conn, "console_overview", {
        "known_types": list(known_types), "cap": cap, "max_types": max_types,
        "max_levels": max_levels})


def console_activity(conn, *, minutes: int) -> list[dict]:
    return _unprepared(conn, "console_activity", {"minutes": minutes}, times=None)


def console_tasks(conn, name: str, params: dict[str, Any]) -> list[dict]:
    """One page of the console's task list by the named statement (console_pending,
    console_running, console_finished or console_live_key_holder): the matches in order,
    then the scan_end row if the reading budget ran out."""
    return _unprepared(conn, name, params)


def console_task(conn, task_id: str) -> dict | None:
    rows = _unprepared(conn, "console_task", {"task_id": task_id})
    return rows[0] if rows else None


def fill_bench_tasks(conn, *, kind: str, first: int, count: int, types: int) -> None:
    """pgtaskd web-bench only, in its scratch schema: ``count`` finished, pending or
    running tasks in one statement."""
    with conn.cursor() as cur:
        cur.execute(QUERIES["web_bench_fill"], {"kind": kind, "first": first, "count": count,
                                                "types": types})
