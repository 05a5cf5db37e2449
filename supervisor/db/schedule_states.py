"""The schedules' shared state: one row per schedule name (through, the definition in force)
and each daemon's report of its own definition (migrations 0006 and 0009)."""

from __future__ import annotations

from datetime import datetime
from typing import Sequence

from .loaders import TimeOrNone, cursor
from .queries import QUERIES


def _rows(conn, name: str, params: dict) -> list[dict]:
    # Any login may write these rows: a time no datetime holds ('infinity', the year 10000)
    # comes back as None instead of failing the pass of every schedule.
    with cursor(conn, times=TimeOrNone) as cur:
        cur.execute(QUERIES[name], params)
        return cur.fetchall()


def _run(conn, name: str, params: dict) -> None:
    with conn.cursor() as cur:
        cur.execute(QUERIES[name], params)


def create_schedule_states(conn, schedules: Sequence[dict], now: datetime) -> set[str]:
    """A row for each of {name, definition, cron, timezone} that has none, starting at now;
    the names this call created."""
    if not schedules:
        return set()
    return {row["name"] for row in _rows(conn, "create_schedule_states", {
        "now": now, "names": [s["name"] for s in schedules],
        "definitions": [s["definition"] for s in schedules],
        "crons": [s["cron"] for s in schedules],
        "timezones": [s["timezone"] for s in schedules]})}


def lock_schedule_states(conn, names: Sequence[str]) -> dict[str, dict]:
    """Schedule name -> {definition, cron, timezone, through, last_enqueued, updated_at} of
    those that have a row, each locked until the caller's transaction ends."""
    rows = _rows(conn, "lock_schedule_states", {"names": list(names)})
    return {row["name"]: row for row in rows}


def schedule_reports(conn, names: Sequence[str]) -> dict[str, list[dict]]:
    """Schedule name -> every daemon's latest {daemon, definition, seen_at}."""
    reports: dict[str, list[dict]] = {}
    for row in _rows(conn, "schedule_reports", {"names": list(names)}):
        reports.setdefault(row["name"], []).append(row)
    return reports


def save_schedule_states(conn, states: Sequence[dict], now: datetime) -> None:
    """Update locked rows with {name, definition, cron, timezone, through, last_enqueued,
    last_task_id, reset}; ``through`` moves back only with ``reset``."""
    if not states:
        return
    _run(conn, "save_schedule_states", {
        "now": now, "names": [s["name"] for s in states],
        "definitions": [s["definition"] for s in states],
        "crons": [s["cron"] for s in states], "timezones": [s["timezone"] for s in states],
        "throughs": [s["through"] for s in states],
        "last_enqueued": [s["last_enqueued"] for s in states],
        "last_task_ids": [s["last_task_id"] for s in states],
        "resets": [bool(s.get("reset")) for s in states]})


def report_definitions(conn, daemon: str, definitions: dict[str, str], now: datetime,
                       forget_before: datetime) -> None:
    """Record this daemon's definition of each schedule, and forget reports older than
    ``forget_before``."""
    names = sorted(definitions)
    _run(conn, "forget_schedule_reports", {"names": names, "before": forget_before})
    _run(conn, "report_schedule_definitions", {
        "daemon": daemon, "now": now, "names": names,
        "definitions": [definitions[name] for name in names]})


def schedule_runs(conn, names: Sequence[str], window_seconds: float) -> dict[str, dict]:
    """Schedule name -> {last_enqueued, last_task_id, last_status, recorded_definition,
    cron, timezone, through, disagreeing (daemons that reported another definition within
    the window)}."""
    rows = _rows(conn, "schedule_runs", {"names": list(names), "window": window_seconds})
    return {row["name"]: row for row in rows}
