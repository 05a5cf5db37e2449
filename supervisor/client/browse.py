"""Browsing the queue as the web console does: the overview by task type, the per-minute
activity, one task with its lease, and the task list by filter, a page at a time.

Every read costs a bounded number of index entries whatever the table holds (see the
console_* statements in queries.sql): counts stop past ``COUNT_CAP`` and say so, and a list
reads at most ``SCAN_BUDGET`` rows per page. A page comes with the key to the next one (an
opaque text, keyset pagination: no OFFSET), which ``browse`` takes back as ``after``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterable

from ..db import queue_figures, store
from ..errors import UsageError, quote
from ..task_fields import MAX_ID_LENGTH, MAX_TASK_TYPE_LENGTH, MAX_UNIQUE_KEY_LENGTH, check_text
from .operate import STATUSES, check_status

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# Rows a page may read to find its matches when texts filter them (a prefix, an error's
# text): past it the page shows what it found and pages on from the last row read.
SCAN_BUDGET = 2000
COUNT_CAP = queue_figures.COUNT_CAP
# The overview lists at most this many task types, and reads at most this many priority
# levels of each for its oldest due task.
MAX_TYPES = 200
MAX_LEVELS = 50
MAX_FILTER_TEXT = 200
ACTIVITY_MINUTES = 60
_PHASES = {"PENDING": ("due", "later"), "RUNNING": ("running",)}
_FINISHED_PHASES = ("finished",)


@dataclass(frozen=True)
class ListFilter:
    """Which tasks a list shows. Only ``status`` picks an index; the texts filter the rows
    read (a unique key among PENDING or RUNNING tasks is looked up in its own index)."""

    status: str = "PENDING"
    task_type: str | None = None
    id_prefix: str | None = None
    name_prefix: str | None = None
    unique_key: str | None = None
    error: str | None = None

    @classmethod
    def checked(cls, *, status: Any = "PENDING", task_type: Any = None, id_prefix: Any = None,
                name_prefix: Any = None, unique_key: Any = None,
                error: Any = None) -> "ListFilter":
        """A filter from untrusted values (a query string), or UsageError naming the field.
        Empty texts mean no filter."""
        return cls(status=check_status(status),
                   task_type=_filter_text("type", task_type, MAX_TASK_TYPE_LENGTH),
                   id_prefix=_filter_text("id", id_prefix, MAX_ID_LENGTH),
                   name_prefix=_filter_text("name", name_prefix, MAX_FILTER_TEXT),
                   unique_key=_filter_text("unique_key", unique_key, MAX_UNIQUE_KEY_LENGTH),
                   error=_filter_text("error", error, MAX_FILTER_TEXT))

    @property
    def residual(self) -> bool:
        """Some rows read may not match: the page needs a reading budget past its size."""
        finished = self.status not in _PHASES
        return bool(self.id_prefix or self.name_prefix or self.error
                    or (self.unique_key and finished) or (self.task_type and finished))


@dataclass(frozen=True)
class Page:
    tasks: list[dict[str, Any]]
    after: str | None
    """The key of the next page (for ``browse(after=...)``); None: this was the last."""
    budget_spent: bool = False
    """Fewer than a page matched within the reading budget: more may match further on."""
    scanned: int = 0
    filters: ListFilter = field(default_factory=ListFilter)


def _filter_text(name: str, value: Any, max_length: int) -> str | None:
    if value is None or value == "":
        return None
    check_text(name, value)
    if len(value) > max_length:
        raise UsageError(f"{name}: longer than {max_length} characters")
    if not value.isprintable():
        raise UsageError(f"{name}: must not contain control characters, got {quote(value)}")
    return value


def encode_key(sort_key: list) -> str:
    text = json.dumps(sort_key, separators=(",", ":"), default=str)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_key(after: str, status: str) -> dict[str, Any]:
    """The after_* parameters of a page key, or UsageError: a key is text from a URL."""
    try:
        raw = base64.urlsafe_b64decode(after + "=" * (-len(after) % 4))
        key = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise UsageError("after: not a page key of this list (start from the first page)") \
            from None
    phases = _PHASES.get(status, _FINISHED_PHASES)
    if not isinstance(key, list) or not key or key[0] not in phases:
        raise UsageError(f"after: not a page key of a {status} list (start from the first "
                         f"page)")
    phase = key[0]
    shape = {"due": (int, str, str, str), "later": (int, str, str, str),
             "running": (str, str), "finished": (str, str)}[phase]
    values = key[1:]
    if len(values) != len(shape) or not all(isinstance(v, t) and not isinstance(v, bool)
                                            for v, t in zip(values, shape)):
        raise UsageError("after: a page key of the wrong shape (start from the first page)")
    times = [v for v, t in zip(values, shape) if t is str][:-1]  # the last str is the id
    for text in times:
        _check_time(text)
    if phase in ("due", "later"):
        return {"after_phase": phase, "after_priority": values[0] if phase == "due" else None,
                "after_time": values[1], "after_created": values[2], "after_id": values[3]}
    return {"after_time": values[0], "after_id": values[1]}


def _check_time(text: str) -> None:
    if text in ("infinity", "-infinity"):
        return
    try:
        datetime.fromisoformat(text)
    except ValueError:
        raise UsageError("after: a page key with a time that is not one") from None


class Browsing:
    """The console's reads; ``ClientConnection`` provides the connection."""

    def overview(self, known_types: Iterable[str] = ()) -> list[dict[str, Any]]:
        """One dict per task type (at most MAX_TYPES, by name): ``due``, ``soon`` (staged,
        due within a second), ``later`` (due after that), ``running``, ``expired`` (RUNNING
        with a lapsed lease), ``failed_24h`` and ``completed_1h`` (from the per-minute
        rollup, through the last complete minute), ``due_since`` and ``oldest_due_age``
        (seconds, None when none is due), ``paused_at``/``paused_by``, ``max_running`` and
        ``slots_in_use``; ``due_at_least``/``later_at_least``: the count stopped past
        COUNT_CAP and is a lower bound. ``known_types`` are listed even with nothing in
        the queue (the handlers of a config)."""
        with self._database() as conn:
            return store.console_overview(conn, known_types=sorted(set(known_types)),
                                          cap=COUNT_CAP, max_types=MAX_TYPES,
                                          max_levels=MAX_LEVELS)

    def activity(self, minutes: int = ACTIVITY_MINUTES) -> list[dict[str, Any]]:
        """The whole queue's rollup of each of the last ``minutes`` complete minutes:
        ``{"minute", "completed", "failed", "due", "due_at_least", "running"}``, the
        figures None for a minute no daemon rolled up (``due`` and ``running`` also for a
        minute rolled up late, whose queue no daemon saw)."""
        with self._database() as conn:
            return store.console_activity(conn, minutes=minutes)

    def inspect(self, task_id: str) -> dict[str, Any] | None:
        """Every column of the task (as ``get``), plus ``lease_left`` (seconds by the
        database's clock, negative once it ran out; None without a lease) and
        ``database_now``; None if there is no such task."""
        task_id = check_text("task_id", task_id)
        if not task_id:
            raise UsageError("task_id: must not be empty")
        with self._database() as conn:
            return store.console_task(conn, task_id)

    def browse(self, filters: ListFilter | None = None, *, after: str | None = None,
               page_size: int = DEFAULT_PAGE_SIZE) -> Page:
        """One page of tasks: PENDING in the order claims take them (due ones by priority,
        due time and age; then those due later, soonest first), RUNNING most recently
        started first, finished ones most recently finished first. ``after`` is the
        previous page's ``Page.after``. UsageError for a bad filter or key."""
        filters = filters or ListFilter()
        if isinstance(page_size, bool) or not isinstance(page_size, int) \
                or not 1 <= page_size <= MAX_PAGE_SIZE:
            raise UsageError(f"page_size: must be from 1 to {MAX_PAGE_SIZE}")
        if after is not None:
            check_text("after", after)
            if len(after) > 2000:
                raise UsageError("after: not a page key (too long)")
        keys = decode_key(after, filters.status) if after else {}
        scan = SCAN_BUDGET if filters.residual else page_size + 1
        params = {"status": filters.status, "task_type": filters.task_type,
                  "id_prefix": filters.id_prefix, "name_prefix": filters.name_prefix,
                  "unique_key": filters.unique_key, "error": filters.error,
                  "after_phase": None, "after_priority": None, "after_time": None,
                  "after_created": None, "after_id": None, **keys,
                  "scan": scan, "page": page_size, "max_types": MAX_TYPES}
        if filters.status == "PENDING":
            name = "console_pending"
        elif filters.status == "RUNNING":
            name = "console_running"
        else:
            name = "console_finished"
        if filters.unique_key and filters.status in _PHASES:
            if after:
                return Page([], None, filters=filters)  # one task at most: no next page
            name = "console_live_key_holder"
        with self._database() as conn:
            rows = store.console_tasks(conn, name, params)
        if name == "console_live_key_holder":
            rows = [row for row in rows if _matches(row, filters)]
        return _page(rows, filters, page_size)


def _page(rows: list[dict], filters: ListFilter, page_size: int) -> Page:
    matched = [row for row in rows if not row["scan_end"]]
    ends = [row for row in rows if row["scan_end"]]
    for row in rows:
        row.pop("scan_end")
        row.pop("phase", None)
    if len(matched) > page_size:
        shown = matched[:page_size]
        after = encode_key(shown[-1]["sort_key"])
        return Page(_without_keys(shown), after, filters=filters)
    if ends:
        after = encode_key(ends[0]["sort_key"])
        return Page(_without_keys(matched), after, budget_spent=True, scanned=SCAN_BUDGET,
                    filters=filters)
    return Page(_without_keys(matched), None, filters=filters)


def _matches(row: dict, filters: ListFilter) -> bool:
    """The residual filters, for the one row a live unique key finds (the list statements
    apply them in SQL)."""
    error = (row["error_message"] or "").lower()
    return ((filters.task_type is None or row["task_type"] == filters.task_type)
            and (filters.id_prefix is None or row["id"].startswith(filters.id_prefix))
            and (filters.name_prefix is None or row["name"].startswith(filters.name_prefix))
            and (filters.error is None or filters.error.lower() in error))


def _without_keys(rows: list[dict]) -> list[dict]:
    for row in rows:
        row.pop("sort_key", None)
    return rows


__all__ = ["ACTIVITY_MINUTES", "Browsing", "COUNT_CAP", "DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE",
           "Page", "SCAN_BUDGET", "STATUSES", "ListFilter", "decode_key", "encode_key"]
