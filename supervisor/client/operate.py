"""Inspecting and operating on tasks: cancel and retry, pauses and limits of task types, and
what the queue holds (a task, a list, counts, the schedules' runs).
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Iterable
from typing import Any

from ..config import MAX_LIMIT, ScheduleConfig
from ..db import queue_figures, schedule_states, store
from ..scheduling.definitions import TAKEOVER_AFTER, definition_of
from ..scheduling.passes import clock_behind
from ..errors import OperationalError, UsageError, quote
from ..task_fields import (MAX_PAUSED_BY_LENGTH, MAX_TASK_TYPE_LENGTH, check_int, check_label,
                           check_text)

STATUSES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED")
CANCELLABLE_STATUSES = ("PENDING", "RUNNING")
RETRYABLE_STATUSES = ("FAILED", "CANCELLED")
DEFAULT_LIST_LIMIT = 50
# How many failed attempts the database keeps per task (migration 0012's trigger).
FAILED_ATTEMPTS_KEPT = 20
MAX_LIST_LIMIT = 10_000


class TaskNotFound(OperationalError):
    """No task has this id."""

    def __init__(self, task_id: str):
        self.task_id = task_id
        super().__init__(f"no task with id {quote(task_id)}")


class TaskStateError(OperationalError):
    """The task exists, but its status does not allow the operation."""

    def __init__(self, task_id: str, status: str, message: str):
        self.task_id = task_id
        self.status = status
        super().__init__(message)


def check_status(status: Any) -> str:
    """An upper-cased task status, or UsageError naming the statuses there are."""
    if not isinstance(status, str) or status.upper() not in STATUSES:
        raise UsageError(f"unknown status {quote(status)} (one of: {', '.join(STATUSES)})")
    return status.upper()


def _check_lookup_id(task_id: Any) -> str:
    """An id to look up may be anything another client stored; only reject what cannot be sent."""
    return _check_lookup_text("task_id", task_id)


def _check_lookup_text(field: str, value: Any) -> str:
    check_text(field, value)
    if not value:
        raise UsageError(f"{field}: must not be empty")
    return value


def who_pauses() -> str:
    """user@host of this process: what a pause records as paused_by unless told otherwise."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login variables and no passwd entry (a bare container)
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _key_held_elsewhere(conn, task_id: str) -> str | None:
    holder = store.unique_key_holder(conn, task_id)
    if holder is None:
        return None
    return (f"its unique_key {quote(holder['unique_key'])} is held by task "
            f"{quote(holder['id'])} ({holder['status']}); retry it once that task has "
            f"finished")


def _marked(pauses: list[dict]) -> list[dict]:
    for pause in pauses:
        pause["due_pending_at_least"] = pause["due_pending"] > queue_figures.COUNT_CAP
    return pauses


class Operating:
    """The client's calls on tasks that exist; ``ClientConnection`` provides the connection."""

    def cancel(self, task_id: str) -> None:
        """PENDING or RUNNING becomes CANCELLED (a running handler sees it at its next lease
        renewal). TaskNotFound, or TaskStateError for a finished task."""
        self._change_status(_check_lookup_id(task_id), store.cancel_task, CANCELLABLE_STATUSES,
                            "cancel", "cancelled")

    def retry(self, task_id: str) -> None:
        """FAILED or CANCELLED becomes PENDING, due now, with its retry budget restored.
        TaskNotFound, or TaskStateError for a task in any other status, or one whose unique
        key another PENDING or RUNNING task holds now (the message names that task)."""
        self._change_status(_check_lookup_id(task_id), store.retry_task, RETRYABLE_STATUSES,
                            "retry", "retried", blocked=_key_held_elsewhere)

    def _change_status(self, task_id: str, change, allowed: tuple[str, ...], verb: str,
                       done: str, blocked=None) -> None:
        """``blocked(conn, task_id)``: why a task in an allowed status was refused all the
        same, or None when nothing stands in its way any more."""
        with self._database() as conn:
            # The status is read after the refusal, so a task that moved into an allowed
            # status in between (a concurrent retry) gets the change again, not a refusal
            # that contradicts itself.
            while not change(conn, task_id):
                current = store.task_status(conn, task_id)
                if current is None:
                    raise TaskNotFound(task_id)
                status = current["status"]
                if status not in allowed:
                    raise TaskStateError(task_id, status,
                                         f"cannot {verb} task {quote(task_id)}: it is {status} "
                                         f"(only {' or '.join(allowed)} tasks can be {done})")
                reason = blocked(conn, task_id) if blocked else None
                if reason:
                    raise TaskStateError(task_id, status, f"cannot {verb} task "
                                                          f"{quote(task_id)}: {reason}")

    def pause(self, task_type: str, *, paused_by: str | None = None) -> bool:
        """Stop every daemon from claiming tasks of this type, from the next claim each one
        makes, with no restart; tasks already claimed run to their end. The pause is a row in
        the database, so it outlives restarts and binds daemons started later. ``paused_by``
        (default: user@host of this process) is what ``stats`` shows. False when the type
        was paused already: that pause is kept as it was."""
        task_type = check_label("task_type", task_type, MAX_TASK_TYPE_LENGTH)
        paused_by = who_pauses() if paused_by is None else check_label(
            "paused_by", paused_by, MAX_PAUSED_BY_LENGTH)
        with self._database() as conn:
            return store.pause_task_type(conn, task_type, paused_by=paused_by) is not None

    def resume(self, task_type: str) -> bool:
        """Let daemons claim this type again, and wake their idle workers at once if some of
        its tasks are due (when the transaction commits, if the connection is in one). False
        when the type was not paused."""
        task_type = _check_lookup_text("task_type", task_type)
        with self._database() as conn:
            return store.resume_task_type(conn, task_type) is not None

    def paused(self) -> list[dict[str, Any]]:
        """The paused task types: ``{"task_type", "paused_at", "paused_by", "due_pending",
        "due_pending_at_least"}`` each (due_pending: its due tasks, which wait for a resume;
        counting stops past 10,000, and then due_pending_at_least is true), by type."""
        with self._database() as conn:
            return _marked(store.list_pauses(conn, cap=queue_figures.COUNT_CAP))

    def set_limit(self, task_type: str, max_running: int, *,
                  set_by: str | None = None) -> dict[str, Any]:
        """At most ``max_running`` tasks of this type RUNNING under a live lease at once,
        across every daemon on this database, from each daemon's next claim on. The limit is
        a row in the database, like a pause. Lowering it stops no running task: the excess
        ends as its tasks do. ``{"task_type", "max_running", "previous" (None if it had
        none), "changed", "notified"}``."""
        task_type = check_label("task_type", task_type, MAX_TASK_TYPE_LENGTH)
        max_running = check_int("max_running", max_running, 1, MAX_LIMIT)
        set_by = who_pauses() if set_by is None else check_label(
            "set_by", set_by, MAX_PAUSED_BY_LENGTH)
        with self._database() as conn:
            return store.set_task_type_limit(conn, task_type, max_running, updated_by=set_by)

    def remove_limit(self, task_type: str) -> bool:
        """Let every daemon run this type's tasks with no global limit again, dropping every
        daemon's claim on it (a config that still sets it claims it again at its daemon's
        next start or change of limits). False when it had none."""
        task_type = _check_lookup_text("task_type", task_type)
        with self._database() as conn:
            return store.remove_task_type_limit(conn, task_type) is not None

    def limits(self) -> list[dict[str, Any]]:
        """The global concurrency limits: ``{"task_type", "max_running", "running",
        "updated_at", "updated_by", "from_claims", "claims"}`` each (running: tasks RUNNING
        under a live lease in one of its slots, by the task rows; claims: each daemon
        config's setting, ``"<daemon>=<n>"``, the smallest of which is in force when
        from_claims), by type."""
        with self._database() as conn:
            return store.list_limits(conn)

    def get(self, task_id: str) -> dict[str, Any] | None:
        """Every column of the task, or None if there is no such task.

        A payload Python's json cannot read (an integer of 5000 digits that another client
        stored, say) comes back as a ``StoredJson``: a str of PostgreSQL's JSON text; a time
        a datetime cannot hold ('infinity', the year 20000) as PostgreSQL's text."""
        task_id = _check_lookup_id(task_id)
        with self._database() as conn:
            return store.get_task(conn, task_id)

    def failed_attempts(self, task_id: str, *, limit: int | None = None
                        ) -> list[dict[str, Any]]:
        """The task's failed attempts, oldest first: the last 20 (the database keeps no
        more), or the newest ``limit`` of them. Each is ``{"attempt", "outcome",
        "worker_id", "started_at", "ended_at", "error_type", "message", "signal",
        "traceback"}``: ``attempt`` is the run's number (the task's ``attempts`` when it
        ended); ``outcome`` one of exception (the handler raised; retried if retries were
        left), permanent (PermanentError, or a task the worker could not run), timeout,
        killed (by the supervisor, for another reason), crashed (its worker died;
        ``signal`` names the signal, if one killed it) or lease_lost (its worker stopped
        renewing the lease, and the reaper or another worker's claim took the task back);
        ``error_type``, ``message`` and ``traceback`` (at most 16 KiB: its head and tail)
        are the exception's, for a run whose handler raised. Empty when the task never
        failed, or does not exist (get() tells which)."""
        task_id = _check_lookup_id(task_id)
        limit = FAILED_ATTEMPTS_KEPT if limit is None else check_int(
            "limit", limit, 1, FAILED_ATTEMPTS_KEPT)
        with self._database() as conn:
            return store.failed_attempts(conn, task_id, limit=limit)

    def list(self, status: str | None = None, task_type: str | None = None,
             limit: int = DEFAULT_LIST_LIMIT) -> list[dict[str, Any]]:
        """Tasks, most recently updated first, each with every column (payloads as in get())."""
        status = None if status is None else check_status(status)
        task_type = None if task_type is None else check_text("task_type", task_type)
        limit = check_int("limit", limit, 1, MAX_LIST_LIMIT)
        with self._database() as conn:
            return store.list_tasks(conn, status=status, task_type=task_type, limit=limit)

    def stats(self) -> dict[str, Any]:
        """Counts by status and by type, the oldest due task's wait, expired leases, pauses.

        ``{"total": int, "by_status": {status: n}, "by_type": {type: {status: n}},
        "due_pending": int, "oldest_pending_age": seconds or None, "expired_leases": int,
        "paused_due_pending": int, "paused_types": [as in paused()], "limits": [as in
        limits()], "not_exact": {figure: "estimate" or "at_least"}}``; every status appears
        in each count, zero or not. Due tasks of paused types are counted in
        paused_due_pending only: due_pending and oldest_pending_age are about the tasks that
        workers may take.

        What it costs does not grow with the table: counts stop past 10,000 and a table of
        200,000 rows or more is estimated from the statistics and a sample. ``not_exact``
        names each figure that is not exact (``"by_status.COMPLETED"``, ``"by_type"``,
        ``"due_pending"``, ...): ``"estimate"``, or ``"at_least"`` for a count that stopped,
        whose figure is a lower bound. Empty: every figure is exact. A paused type's
        ``due_pending`` stops the same way (``due_pending_at_least``).
        """
        with self._database() as conn:
            live = queue_figures.live_counts(conn)
            by_status, by_type, not_exact = queue_figures.counts_by_type(conn, live)
            summary = queue_figures.queue_health(conn)
            pauses = _marked(store.list_pauses(conn, cap=queue_figures.COUNT_CAP))
            limits = store.list_limits(conn)
        names = {"due_pending": "due_pending", "paused_due": "paused_due_pending",
                 "expired_leases": "expired_leases"}
        not_exact.update({names[figure]: kind for figure, kind in summary["not_exact"].items()
                          if figure in names})
        return {"total": sum(by_status.values()), "by_status": by_status, "by_type": by_type,
                "due_pending": summary["due_pending"],
                "oldest_pending_age": summary["oldest_pending_age"],
                "expired_leases": summary["expired_leases"],
                "paused_due_pending": summary["paused_due"], "paused_types": pauses,
                "limits": limits, "not_exact": not_exact}

    def schedule_status(self, schedules: Iterable[ScheduleConfig] | None = None
                        ) -> list[dict[str, Any]]:
        """Each schedule (by default, those of the config this client was made from) with
        when it runs next and when it last ran, in config order.

        ``{"name", "cron", "timezone", "task_type", "catch_up", "next_run", "last_run",
        "last_task_id", "last_status", "definition", "recorded_definition", "conflict",
        "disagreeing", "through", "database_now", "clock"}``: ``next_run`` is the first
        instant after the database's clock as this config defines the schedule (None if it
        has none within 50 years), or after ``through`` while the schedule waits for the
        clock; ``last_run`` the newest instant any daemon enqueued, ``last_task_id`` its
        task and ``last_status`` that task's status (None once it was deleted); the last three
        are None for a schedule that never ran. ``definition`` is the hash of this config's
        definition, ``recorded_definition`` the one in force (None before any daemon ran
        it); ``conflict`` is true when they differ or when a daemon reported another
        definition lately (those daemons are ``disagreeing``): while it lasts, the daemons
        whose definition is not the recorded one enqueue nothing for it. ``through`` is the
        instant its state says it was enqueued through (None before its first pass, or where
        no datetime holds it); ``clock`` is None, or, when ``through`` is ahead of
        ``database_now`` (the clock went back, or the row was written by hand), ``waits``
        (the daemons enqueue nothing until the clock passes it) or ``reanchors`` (too far
        ahead: the next pass starts the schedule again at the clock).
        """
        if schedules is None:
            if self._config is None:
                raise UsageError("schedule_status: give the schedules, or make the client "
                                 "with Client.from_config()")
            schedules = self._config.schedules
        schedules = list(schedules)
        with self._database() as conn:
            now = store.database_now(conn)
            runs = schedule_states.schedule_runs(
                conn, [s.name for s in schedules], TAKEOVER_AFTER.total_seconds()
            ) if schedules else {}
        status = []
        for schedule in schedules:
            run = runs.get(schedule.name, {})
            definition = definition_of(schedule)
            recorded = run.get("recorded_definition")
            disagreeing = list(run.get("disagreeing") or [])
            through = run.get("through")
            # A state reached with another expression is not waited for: it starts afresh.
            same = (run.get("cron"), run.get("timezone")) == (schedule.cron.expression,
                                                             schedule.cron.timezone)
            clock = clock_behind(schedule.cron, through, now) if same and through else None
            status.append({
                "name": schedule.name, "cron": schedule.cron.expression,
                "timezone": schedule.cron.timezone, "task_type": schedule.task_type,
                "catch_up": schedule.catch_up,
                "next_run": schedule.cron.next_after(through if clock == "waits" else now),
                "last_run": run.get("last_enqueued"), "last_task_id": run.get("last_task_id"),
                "last_status": run.get("last_status"), "definition": definition,
                "recorded_definition": recorded,
                "conflict": bool(recorded and recorded != definition or disagreeing),
                "disagreeing": disagreeing, "through": through, "database_now": now,
                "clock": clock})
        return status
