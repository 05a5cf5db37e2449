"""Bulk actions: retry, cancel or purge every task a filter matches, in bounded batches.

    from datetime import timedelta
    from supervisor import Client, TaskFilter

    with Client("postgresql://app@db/pgtaskd") as client:
        where = TaskFilter(task_types=["charge"], since=timedelta(hours=1), error="timeout")
        print(client.retry_matching(where, dry_run=True).matched)
        print(client.retry_matching(where))

An action walks the tasks of one status and one type at a time, in a fixed order (by when
they finished for retry and purge, by when they were submitted for cancel), at most
``batch_size`` rows a batch. A batch is read in one statement, starting after the last row
of the batch before (a keyset on an index: the millionth row costs what the first does), and
written in a second, which locks each row and re-checks its status and time: a row another
session changed in between (retried, cancelled, deleted) or holds locked is skipped, and
only what this call changed is counted. On a client that owns its connection each statement
commits on its own, so a million rows never take a million row locks or one long
transaction; on a borrowed connection they all run in the caller's transaction.

The time window is fixed as the action starts, by the database's clock, and never reaches
past that start: a task that finishes (or is submitted) while the action runs is not taken.
A dry run reads the same batches and writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from ..db import store
from ..db.queue_figures import COUNT_CAP
from ..errors import UsageError, quote
from ..task_fields import (MAX_DELAY_SECONDS, MAX_ID_LENGTH, MAX_NAME_LENGTH,
                           MAX_UNIQUE_KEY_LENGTH, aware_utc, check_int, check_text, kind_of)
from .operate import STATUSES

DEFAULT_BULK_BATCH = 1000
MAX_BULK_BATCH = 10_000
# A filter naming more types than this is a list pasted by mistake, not a selection.
MAX_FILTER_TYPES = 100
MAX_ERROR_TEXT_LENGTH = 1000
# Each action's statuses: the first are its default when the filter names none.
ACTION_STATUSES = {
    "retry": ("FAILED", "CANCELLED"),
    "cancel": ("PENDING",),
    "purge": ("COMPLETED", "FAILED", "CANCELLED"),
}
FILTER_FIELDS = ("task_types", "statuses", "since", "before", "error", "id_prefix",
                 "name_prefix", "unique_key")


@dataclasses.dataclass(frozen=True)
class TaskFilter:
    """Which tasks a bulk action takes; every field given must match (an empty filter is
    refused: name at least one field). Checked when made: a bad value raises UsageError
    naming its field.

    ``since`` and ``before`` bound when the task finished (retry, purge; a finished row
    without a finished_at counts from its updated_at, as retention does) or was submitted
    (cancel, its created_at): an aware datetime, or a timedelta counted back from the
    database's clock as the action starts. since is inclusive, before exclusive.
    ``error`` matches a piece of the last error message, whatever its case (its ``%`` and
    ``_`` are plain characters). ``statuses`` defaults to every status the action takes."""

    task_types: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since: datetime | timedelta | None = None
    before: datetime | timedelta | None = None
    error: str | None = None
    id_prefix: str | None = None
    name_prefix: str | None = None
    unique_key: str | None = None

    def __post_init__(self) -> None:
        # Frozen: the checked values are set as the dataclass's own __init__ sets fields.
        object.__setattr__(self, "task_types", _checked_types(self.task_types))
        object.__setattr__(self, "statuses", _checked_statuses(self.statuses))
        object.__setattr__(self, "since", _checked_time("since", self.since))
        object.__setattr__(self, "before", _checked_time("before", self.before))
        _check_window(self.since, self.before)
        for field, bound in (("error", MAX_ERROR_TEXT_LENGTH), ("id_prefix", MAX_ID_LENGTH),
                             ("name_prefix", MAX_NAME_LENGTH),
                             ("unique_key", MAX_UNIQUE_KEY_LENGTH)):
            _check_optional_text(field, getattr(self, field), bound)
        if all(getattr(self, f.name) in (None, ()) for f in dataclasses.fields(self)):
            raise UsageError(f"give at least one filter: {', '.join(FILTER_FIELDS)}")

    def statuses_for(self, action: str) -> tuple[str, ...]:
        """The statuses this action walks: those of the filter, which the action must take."""
        allowed = ACTION_STATUSES[action]
        for status in self.statuses:
            if status not in allowed:
                raise UsageError(_refused_status(action, status))
        return self.statuses or allowed

    def matching(self) -> dict[str, str | None]:
        """The conditions a scan checks on each row of its index range."""
        return {"error": self.error, "id_prefix": self.id_prefix,
                "name_prefix": self.name_prefix, "unique_key": self.unique_key}


def _refused_status(action: str, status: str) -> str:
    if action == "cancel" and status == "RUNNING":
        return ("statuses: a bulk cancel takes PENDING tasks only; cancel a RUNNING task by "
                "its id")
    *others, last = ACTION_STATUSES[action]
    allowed = f"{', '.join(others)} or {last}" if others else last
    return f"statuses: {action} takes {allowed} tasks, not {status}"


def _checked_types(task_types: Any) -> tuple[str, ...]:
    if isinstance(task_types, str):
        task_types = (task_types,)
    if not isinstance(task_types, Iterable):
        raise UsageError(f"task_types: must be a list of task types, got {kind_of(task_types)}")
    checked = []
    for task_type in task_types:
        check_text("task_types", task_type)
        if not task_type:
            raise UsageError("task_types: a task type must not be empty")
        checked.append(task_type)
        if len(checked) > MAX_FILTER_TYPES:
            raise UsageError(f"task_types: more than {MAX_FILTER_TYPES} task types")
    return tuple(dict.fromkeys(checked))


def _checked_statuses(statuses: Any) -> tuple[str, ...]:
    if isinstance(statuses, str):
        statuses = (statuses,)
    if not isinstance(statuses, Iterable):
        raise UsageError(f"statuses: must be a list of statuses, got {kind_of(statuses)}")
    checked = []
    for status in statuses:
        if not isinstance(status, str) or status.upper() not in STATUSES:
            raise UsageError(f"statuses: unknown status {quote(status)} "
                             f"(one of: {', '.join(STATUSES)})")
        checked.append(status.upper())
    return tuple(dict.fromkeys(checked))


def _checked_time(field: str, value: Any) -> datetime | timedelta | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        if not timedelta(0) <= value <= timedelta(seconds=MAX_DELAY_SECONDS):
            raise UsageError(f"{field}: a duration back from now must be from 0 to "
                             f"{MAX_DELAY_SECONDS} seconds, got {quote(value)}")
        return value
    if isinstance(value, datetime):
        return aware_utc(field, value)
    raise UsageError(f"{field}: must be a datetime or a timedelta (that long before now), "
                     f"got {kind_of(value)}")


def _check_window(since, before) -> None:
    """since must come before before, where that can be told without the clock."""
    if since is None or before is None or type(since) is not type(before):
        return
    empty = since >= before if isinstance(since, datetime) else since <= before
    if empty:
        raise UsageError("since: must be earlier than before (the window is empty)")


def _check_optional_text(field: str, value: Any, max_length: int) -> None:
    if value is None:
        return
    check_text(field, value)
    if not value:
        raise UsageError(f"{field}: must not be empty")
    if len(value) > max_length:
        raise UsageError(f"{field}: longer than {max_length} characters")


@dataclasses.dataclass
class BulkOutcome:
    """What a bulk action did, or (dry_run) what it would do now.

    ``matched``: tasks that matched the filter as their batch was read. ``changed``: those
    this call retried, cancelled or deleted (0 in a dry run). ``refused`` (retry only): those
    left alone because a PENDING or RUNNING task holds their unique key, or because an
    earlier task of this retry took it back (in a dry run: would be, as things stand).
    ``skipped``: those another session changed or held locked between the read and the
    write. ``batches``: batches read. ``reached_max``: the action stopped at ``max_tasks``
    (more tasks may match). ``at_least``: a dry run given no max_tasks stopped counting past
    10,000 tasks it would change, so its figures are lower bounds.
    """

    action: str
    dry_run: bool
    matched: int = 0
    changed: int = 0
    refused: int = 0
    skipped: int = 0
    batches: int = 0
    reached_max: bool = False
    at_least: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def taken(self) -> int:
        """Tasks done, or in a dry run that would be: what max_tasks bounds."""
        return self.matched - self.refused if self.dry_run else self.changed


Progress = Callable[[BulkOutcome], None]


class BulkOperating:
    """The client's bulk actions; ``ClientConnection`` provides the connection."""

    def retry_matching(self, where: TaskFilter | None = None, /, *, dry_run: bool = False,
                       batch_size: int = DEFAULT_BULK_BATCH, max_tasks: int | None = None,
                       progress: Progress | None = None, **filters) -> BulkOutcome:
        """Retry every FAILED or CANCELLED task the filter matches (a TaskFilter, or its
        fields as keywords), as ``retry()`` does one: PENDING, due now, with its retry budget
        restored. A task whose unique key a PENDING or RUNNING task holds is refused and
        counted in ``refused``. At most ``max_tasks`` retried; ``dry_run`` writes nothing
        and counts; ``progress`` is called with the outcome so far after each batch."""
        return self._walk("retry", _filter(where, filters), dry_run=dry_run,
                          batch_size=batch_size, max_tasks=max_tasks, progress=progress)

    def cancel_matching(self, where: TaskFilter | None = None, /, *, dry_run: bool = False,
                        batch_size: int = DEFAULT_BULK_BATCH, max_tasks: int | None = None,
                        progress: Progress | None = None, **filters) -> BulkOutcome:
        """Cancel every PENDING task the filter matches (since and before: when it was
        submitted). RUNNING tasks are not taken: cancel those one by one with ``cancel()``.
        Otherwise as retry_matching()."""
        return self._walk("cancel", _filter(where, filters), dry_run=dry_run,
                          batch_size=batch_size, max_tasks=max_tasks, progress=progress)

    def purge_matching(self, where: TaskFilter | None = None, /, *, dry_run: bool = False,
                       batch_size: int = DEFAULT_BULK_BATCH, max_tasks: int | None = None,
                       progress: Progress | None = None, **filters) -> BulkOutcome:
        """Delete every COMPLETED, FAILED or CANCELLED task the filter matches, now, beside
        what retention deletes by age. Otherwise as retry_matching()."""
        return self._walk("purge", _filter(where, filters), dry_run=dry_run,
                          batch_size=batch_size, max_tasks=max_tasks, progress=progress)

    def _walk(self, action: str, where: TaskFilter, *, dry_run: bool, batch_size: int,
              max_tasks: int | None, progress: Progress | None) -> BulkOutcome:
        statuses = where.statuses_for(action)
        batch_size = check_int("batch_size", batch_size, 1, MAX_BULK_BATCH)
        if max_tasks is not None:
            max_tasks = check_int("max_tasks", max_tasks, 1, 2**63 - 1)
        # A dry run counts past 10,000 only when asked to (max_tasks), as stats does.
        cap = max_tasks if max_tasks is not None else COUNT_CAP + 1 if dry_run else None
        walk = _Walk(action, where, dry_run=dry_run, batch_size=batch_size, cap=cap)
        with self._database() as conn:
            walk.window = store.bulk_window(conn, **_window_params(where))
            for status in statuses:
                for task_type in _task_types(conn, status, where.task_types):
                    if not walk.run(conn, status, task_type, progress):
                        walk.outcome.reached_max = max_tasks is not None
                        walk.outcome.at_least = max_tasks is None
                        return walk.outcome
        return walk.outcome


def _filter(where: TaskFilter | None, filters: dict[str, Any]) -> TaskFilter:
    if where is not None and filters:
        raise UsageError(f"give a TaskFilter or its fields, not both (got "
                         f"{', '.join(sorted(filters))} beside a TaskFilter)")
    if where is None:
        unknown = sorted(set(filters) - set(FILTER_FIELDS))
        if unknown:
            raise UsageError(f"{unknown[0]}: not a filter (one of: {', '.join(FILTER_FIELDS)})")
        return TaskFilter(**filters)
    if not isinstance(where, TaskFilter):
        raise UsageError(f"where: must be a TaskFilter, got {kind_of(where)}")
    return where


def _window_params(where: TaskFilter) -> dict[str, Any]:
    params = {}
    for field in ("since", "before"):
        value = getattr(where, field)
        params[f"{field}_at"] = value if isinstance(value, datetime) else None
        params[f"{field}_seconds"] = (value.total_seconds() if isinstance(value, timedelta)
                                      else None)
    return params


def _task_types(conn, status: str, given: tuple[str, ...]) -> Iterator[str]:
    """The filter's types, or every type with tasks in this status, one probe at a time."""
    if given:
        yield from given
        return
    task_type = store.next_task_type(conn, status=status, after=None)
    while task_type is not None:
        yield task_type
        task_type = store.next_task_type(conn, status=status, after=task_type)


class _Walk:
    """One action's progress over its (status, type) walks, batch by batch."""

    def __init__(self, action: str, where: TaskFilter, *, dry_run: bool, batch_size: int,
                 cap: int | None):
        self.action = action
        self.where = where
        self.matching = where.matching()
        self.batch_size = batch_size
        self.cap = cap
        self.window: tuple[str, str] = ("-infinity", "infinity")
        self.outcome = BulkOutcome(action, dry_run)
        # A dry-run retry: the unique keys that a retry earlier in the walk would take back.
        self.keys_taken: set[str] = set()

    def run(self, conn, status: str, task_type: str, progress: Progress | None) -> bool:
        """Walk one status and type to its end: False once the cap is reached."""
        after = store.walk_start(self.window)
        while True:
            rows = store.scan_tasks(conn, status=status, task_type=task_type,
                                    window=self.window, after=after, limit=self.batch_size,
                                    matching=self.matching,
                                    with_holders=self.outcome.dry_run and self.action == "retry")
            self.outcome.batches += 1
            chosen, last = self._choose(rows)
            if chosen:
                self._apply(conn, status, chosen)
            if progress is not None:
                progress(dataclasses.replace(self.outcome))
            if self.cap is not None and self.outcome.taken >= self.cap:
                return False
            if last is None or (last is rows[-1] and len(rows) < self.batch_size):
                return True
            after = (last["position"], last["id"])

    def _choose(self, rows: list[dict]) -> tuple[list[dict], dict | None]:
        """The wanted rows of a batch, no more than the cap leaves room for, and the last
        row looked at (the next batch starts after it)."""
        room = None if self.cap is None else self.cap - self.outcome.taken
        chosen, last = [], None
        for row in rows:
            if room is not None and len(chosen) >= room:
                break
            last = row
            if row["wanted"]:
                chosen.append(row)
        return chosen, last

    def _apply(self, conn, status: str, chosen: list[dict]) -> None:
        outcome = self.outcome
        outcome.matched += len(chosen)
        if outcome.dry_run:
            if self.action == "retry":
                outcome.refused += sum(self._would_refuse(row) for row in chosen)
            return
        ids = [row["id"] for row in chosen]
        if self.action == "retry":
            changed, refused = store.retry_scanned(conn, ids, status=status, window=self.window)
        elif self.action == "cancel":
            changed, refused = store.cancel_scanned(conn, ids, window=self.window), 0
        else:
            changed, refused = store.purge_scanned(conn, ids, status=status,
                                                   window=self.window), 0
        outcome.changed += changed
        outcome.refused += refused
        outcome.skipped += len(ids) - changed - refused

    def _would_refuse(self, row: dict) -> bool:
        key = row["unique_key"]
        if key is None:
            return False
        if row["key_held"] or key in self.keys_taken:
            return True
        self.keys_taken.add(key)
        return False
