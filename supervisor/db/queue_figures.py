"""The queue's figures for the health check, its gauges and ``pgtaskd stats``, at a cost that
the table's size does not set.

Every daemon reads them every few seconds, on a table that may hold millions of tasks. So a
count that could run long stops at ``COUNT_CAP`` + 1 rows, and what it would have counted past
that comes from the planner's statistics, or is given as a lower bound. Every figure that is
not exact is named in a ``not_exact`` map, figure -> ``"estimate"`` (the statistics' or a
sample's guess) or ``"at_least"`` (a count that stopped: the figure is a lower bound).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..config import FINISHED_STATUSES
from .loaders import cursor
from .queries import QUERIES

STATUSES = ("PENDING", "RUNNING", *FINISHED_STATUSES)
ESTIMATE = "estimate"
AT_LEAST = "at_least"
# Counts stop past this many rows: reading 10,001 index entries costs a few milliseconds.
COUNT_CAP = 10_000
# The health check, which every daemon runs every few seconds, stops sooner: it asks whether
# something is wrong, and "more than 1,000 due tasks waited too long" says it (reading
# 10,001 entries twice took 38 ms a check on a loaded machine, 1,001 took 10).
HEALTH_COUNT_CAP = 1_000
# Below this many rows (by the planner's estimate) every status is counted exactly, and
# stats counts by type exactly too.
EXACT_COUNT_BELOW = 200_000
# About how many rows stats samples on a larger table, to split each status's total by type.
SAMPLE_ROWS = 10_000
# The health check's sample, to split an estimated PENDING total among the types whose count
# stopped at the cap: smaller, as it may run every few seconds (2,000 rows took 2-3 ms).
HEALTH_SAMPLE_ROWS = 2_000
# The label of every task type no config of the daemon names, summed: a row may carry any
# type, and one series per type would let the table set the metrics' cardinality.
OTHER_TYPES = "_other"
# The other types whose oldest due task the health check looks for (one probe each): past
# them, the other types' age is a lower bound.
MAX_OTHER_TYPES = 20
# Priority levels read per type for its oldest due task (as the console's overview).
MAX_LEVELS = 50


def _rows(conn, name: str, params: dict[str, Any], *, answers: bool = True) -> list[dict]:
    with cursor(conn, times=None) as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchall() if answers else []


def queue_health(conn, *, max_pending_age: float = 0.0, lease_grace: float = 0.0,
                 cap: int | None = None, task_types=None) -> dict:
    """{due_pending, paused_due, foreign_due, old_pending, expired_leases, stuck_leases,
    oldest_pending_age (seconds, or None), paused_types, not_exact}; old and stuck count
    against the given ages. Due tasks of paused types count only in paused_due, and with
    ``task_types`` (the types the asking daemon runs) due tasks of other types only in
    foreign_due. The counts stop past cap (default COUNT_CAP; not_exact names them
    ``at_least``); the age is always exact."""
    cap = COUNT_CAP if cap is None else cap
    (row,) = _rows(conn, "queue_health", {
        "max_pending_age": max_pending_age, "lease_grace": lease_grace, "cap": cap,
        "types": None if task_types is None else sorted(task_types)})
    not_exact = {}
    if row.pop("head_full"):
        not_exact["due_pending"] = AT_LEAST
    if row.pop("paused_at_least"):
        not_exact["paused_due"] = AT_LEAST
        if task_types is not None:
            not_exact["foreign_due"] = AT_LEAST
    if row.pop("old_pending_at_least"):
        not_exact["old_pending"] = AT_LEAST
    if row.pop("leases_at_least"):
        not_exact.update(dict.fromkeys(("expired_leases", "stuck_leases"), AT_LEAST))
    row["not_exact"] = not_exact
    return row


class TypeFigures(NamedTuple):
    pending: int
    running: int
    # Seconds since the oldest due PENDING task became due; None: none is due.
    oldest_due_age: float | None
    # "pending" or "oldest_due_age" -> ESTIMATE or AT_LEAST, for the figures not exact.
    not_exact: dict[str, str]


def queue_by_type(conn, known_types, *, cap: int, live: "LiveCounts") -> dict[str, TypeFigures]:
    """PENDING and RUNNING tasks and the oldest due age of each of ``known_types``, and of every
    other type summed under OTHER_TYPES. A PENDING count stops past cap; when the PENDING total
    (``live``, from live_counts) is the statistics' estimate, the stopped counts become that
    total split by a small sample's shares (ESTIMATE), else they stay lower bounds
    (AT_LEAST)."""
    types = sorted(set(known_types))
    with conn.transaction():
        _rows(conn, "queue_by_type_plan", {}, answers=False)
        rows = _rows(conn, "queue_by_type", {"types": types, "cap": cap,
                                              "max_levels": MAX_LEVELS,
                                              "max_other": MAX_OTHER_TYPES})
    figures: dict[str, TypeFigures] = {}
    for row in rows:
        label = OTHER_TYPES if row["task_type"] is None else row["task_type"]
        not_exact = {}
        if row["pending"] > cap:
            not_exact["pending"] = AT_LEAST
        if row["other_types_at_least"]:
            not_exact["oldest_due_age"] = AT_LEAST
        figure = TypeFigures(row["pending"], row["running"], row["oldest_due_age"], not_exact)
        # A config may name a type "_other" itself: it shares the series.
        figures[label] = _merged(figures[label], figure) if label in figures else figure
    capped = [label for label, f in figures.items() if "pending" in f.not_exact]
    if capped and live.not_exact.get("PENDING") == ESTIMATE:
        _split_estimate(conn, figures, capped, types, live)
    return dict(sorted(figures.items(), key=lambda item: (item[0] == OTHER_TYPES, item[0])))


def _merged(a: TypeFigures, b: TypeFigures) -> TypeFigures:
    ages = [age for age in (a.oldest_due_age, b.oldest_due_age) if age is not None]
    return TypeFigures(a.pending + b.pending, a.running + b.running,
                       max(ages) if ages else None, {**a.not_exact, **b.not_exact})


def _split_estimate(conn, figures, capped, types, live: "LiveCounts") -> None:
    percent = min(100.0, 100.0 * HEALTH_SAMPLE_ROWS / max(live.table_rows or 1.0, 1.0))
    sampled = {OTHER_TYPES if row["task_type"] is None else row["task_type"]: row["count"]
               for row in _rows(conn, "sample_pending_by_type",
                                {"percent": percent, "types": types})}
    in_sample = sum(sampled.values())
    for label in capped:
        if not sampled.get(label):
            continue  # too few to be seen: the count's lower bound says more
        figure = figures[label]
        share = round(live.counts["PENDING"] * sampled[label] / in_sample)
        figures[label] = figure._replace(pending=max(figure.pending, share),
                                         not_exact={**figure.not_exact, "pending": ESTIMATE})


class LiveCounts(NamedTuple):
    counts: dict[str, int]
    # Status -> ESTIMATE or AT_LEAST, for the counts that are not exact.
    not_exact: dict[str, str]
    # The planner's estimate of the table's rows; None before the first ANALYZE or VACUUM.
    table_rows: float | None

    @property
    def small(self) -> bool:
        """Small enough, or unknown enough, to count every row."""
        return self.table_rows is None or self.table_rows < EXACT_COUNT_BELOW


def live_counts(conn, *, cap: int | None = None) -> LiveCounts:
    """Tasks by status, cheaply: RUNNING exact; PENDING exact up to cap (default COUNT_CAP),
    else the statistics' estimate; finished statuses exact on a small table, else
    estimated."""
    cap = COUNT_CAP if cap is None else cap
    (row,) = _rows(conn, "live_counts", {"cap": cap})
    counts = {"PENDING": row["pending_seen"], "RUNNING": row["running"]}
    not_exact = {}
    shares = row["shares"] or {}
    table_rows = row["table_rows"]
    if row["pending_seen"] > cap:
        if table_rows is not None and "PENDING" in shares:
            counts["PENDING"] = max(cap + 1, round(table_rows * shares["PENDING"]))
            not_exact["PENDING"] = ESTIMATE
        else:
            not_exact["PENDING"] = AT_LEAST
    live = LiveCounts(counts, not_exact, table_rows)
    if live.small or not shares:
        counts.update(dict.fromkeys(FINISHED_STATUSES, 0))
        counts.update({r["status"]: r["count"] for r in _rows(conn, "count_finished", {})})
        return live
    finished_shares = {status: shares.get(status, 0.0) for status in FINISHED_STATUSES}
    finished = max(0.0, table_rows - counts["PENDING"] - counts["RUNNING"])
    total_share = sum(finished_shares.values()) or 1.0
    counts.update({status: round(finished * share / total_share)
                   for status, share in finished_shares.items()})
    not_exact.update(dict.fromkeys(FINISHED_STATUSES, ESTIMATE))
    return live


def counts_by_type(conn, live: LiveCounts) -> tuple[dict[str, int], dict[str, dict[str, int]],
                                                    dict[str, str]]:
    """(by_status, by_type, not_exact) for stats. A small table is counted exactly, row by
    row. A larger one keeps live_counts' totals and splits each by type as a sample of the
    table's pages does, but for RUNNING, and PENDING when under the cap, counted exactly."""
    by_status = dict.fromkeys(STATUSES, 0)
    by_type: dict[str, dict[str, int]] = {}
    if live.small:
        for row in _rows(conn, "count_by_type_and_status", {}):
            by_status[row["status"]] += row["count"]
            by_type.setdefault(row["task_type"], dict.fromkeys(STATUSES, 0))[row["status"]] = \
                row["count"]
        return by_status, by_type, {}
    by_status.update(live.counts)
    percent = min(100.0, 100.0 * SAMPLE_ROWS / max(live.table_rows, 1.0))
    sampled: dict[str, dict[str, int]] = {}
    for row in _rows(conn, "sample_by_type_and_status", {"percent": percent}):
        sampled.setdefault(row["status"], {})[row["task_type"]] = row["count"]
    exact = {"RUNNING"} | ({"PENDING"} if "PENDING" not in live.not_exact else set())
    for status in STATUSES:
        if status in exact:
            continue
        seen = sampled.get(status, {})
        in_sample = sum(seen.values())
        for task_type, count in seen.items():
            share = round(by_status[status] * count / in_sample)
            if share:
                by_type.setdefault(task_type, dict.fromkeys(STATUSES, 0))[status] = share
    for row in _rows(conn, "live_by_type", {"pending": "PENDING" in exact}):
        by_type.setdefault(row["task_type"], dict.fromkeys(STATUSES, 0))[row["status"]] = \
            row["count"]
    not_exact = {f"by_status.{status}": kind for status, kind in live.not_exact.items()}
    kinds = set(live.not_exact.values())
    if kinds:
        not_exact["total"] = ESTIMATE if ESTIMATE in kinds else AT_LEAST
    not_exact["by_type"] = ESTIMATE
    return by_status, dict(sorted(by_type.items())), not_exact
