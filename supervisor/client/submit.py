"""Submitting tasks: one or many in one statement, each checked first, with ids that make a
retried enqueue safe.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from ..db import store
from ..errors import OperationalError, UsageError, quote
from ..task_fields import SUBMIT_FIELDS, NewTask, kind_of, prepare_task

# A submit whose unique key was held when it inserted, by a task that finished before the
# submit could look it up, inserts again: each round needs a holder to finish within
# milliseconds, so a few rounds are plenty.
MAX_SUBMIT_ROUNDS = 5


class SubmittedId(str):
    """The id of a submitted task; ``created`` is False when a task with this id existed, or
    when a PENDING or RUNNING task held the submit's unique key (the id is then that task's).

    A str, so ``submit()`` keeps returning the plain id callers store and compare. Finding
    the id taken is the expected outcome of retrying an enqueue (that is what a caller's own
    id is for), so it is neither an exception nor a different return type: callers that care
    read ``.created``, the rest never notice. The existing task is left exactly as it was,
    whatever the second submit asked for.
    """

    created: bool

    def __new__(cls, task_id: str, created: bool) -> "SubmittedId":
        instance = super().__new__(cls, task_id)
        instance.created = created
        return instance

    def __getnewargs__(self):
        return str(self), self.created

    def __repr__(self) -> str:
        return f"SubmittedId({str(self)!r}, created={self.created})"


def _as_json(tasks: list[NewTask]) -> str:
    """The tasks as one JSON array for submit_tasks; each payload is already JSON text and
    goes in as it is."""
    dumps = json.dumps
    return "[" + ",".join(
        f'{{"id":{dumps(t.id)},"name":{dumps(t.name)},"task_type":{dumps(t.task_type)},'
        f'"payload":{t.payload_json},"priority":{t.priority},'
        f'"run_at":{dumps(t.run_at.isoformat()) if t.run_at is not None else "null"},'
        f'"delay_seconds":{dumps(t.delay_seconds)},"max_retries":{t.max_retries},'
        f'"unique_key":{dumps(t.unique_key)}}}'
        for t in tasks) + "]"


def encoded_size(task: NewTask) -> int:
    """The bytes of a submit_tasks statement's JSON for this task alone: tasks sent together
    take at most the sum of theirs. What a caller that cuts many tasks into statements counts
    (the scheduler's catch-up)."""
    return len(_as_json([task]).encode())


class Submitting:
    """The client's submit calls; ``ClientConnection`` provides the connection."""

    def submit(self, task_type: str, payload: Mapping[str, Any] | None = None, *,
               priority: int = 0, run_at: datetime | None = None,
               delay: float | timedelta | None = None, task_id: str | None = None,
               name: str | None = None, max_retries: int = 3,
               unique_key: str | None = None) -> SubmittedId:
        """Enqueue a task and return its id (a new UUID unless ``task_id`` is given).

        ``run_at`` (an aware datetime) or ``delay`` (seconds, or a timedelta, counted from the
        database's clock) postpone it. Submitting an id that exists writes nothing and returns
        that id with ``.created`` False, so a retried enqueue never runs the work twice. Only
        a caller-chosen ``task_id`` makes a retry safe: a generated one is new every call.

        ``unique_key``: while a PENDING or RUNNING task holds this key, a submit with it
        writes nothing and returns that task's id with ``.created`` False; a finished task
        does not hold its key. An id that exists wins over a held key: its own id is returned.
        """
        task = prepare_task(task_type, payload, priority=priority, run_at=run_at, delay=delay,
                            task_id=task_id, name=name, max_retries=max_retries,
                            unique_key=unique_key, max_payload_bytes=self.max_payload_bytes)
        return self._insert([task])[0]

    def submit_many(self, tasks: Iterable[Mapping[str, Any]]) -> list[SubmittedId]:
        """Enqueue many tasks in one statement; each mapping holds ``submit()``'s arguments.

        Returns the ids in input order, with ``.created`` as for ``submit()``; an id given
        twice in one batch is created once, by its first copy, and so is a unique key: a
        later task with the same key gets the first one's id, with ``.created`` False. One bad
        task rejects the batch.
        """
        prepared = []
        for position, spec in enumerate(tasks):
            if not isinstance(spec, Mapping):
                raise UsageError(f"tasks[{position}]: must be a mapping of submit() arguments, "
                                 f"got {kind_of(spec)}")
            arguments = dict(spec)
            unknown = sorted(set(arguments) - SUBMIT_FIELDS, key=str)
            if unknown:
                raise UsageError(f"tasks[{position}]: unknown field {quote(unknown[0])} "
                                 f"(fields: {', '.join(sorted(SUBMIT_FIELDS))})")
            if "task_type" not in arguments:
                raise UsageError(f"tasks[{position}]: task_type is missing")
            try:
                prepared.append(prepare_task(**arguments,
                                             max_payload_bytes=self.max_payload_bytes))
            except UsageError as exc:
                raise UsageError(f"tasks[{position}]: {exc}") from None
        return self._insert(prepared) if prepared else []

    def _insert(self, tasks: list[NewTask]) -> list[SubmittedId]:
        """Insert the tasks; each one's id in input order, or the id of the task holding its
        unique key. Tasks without a key take one statement; a key found held takes a second,
        to look up its holder. A third, inserting again, is only for a holder that finished in
        between; on an autocommit connection it is a transaction of its own, like the first
        (wrapping every keyed submit in BEGIN and COMMIT for that rare case would cost two
        round trips each)."""
        results: list[SubmittedId | None] = [None] * len(tasks)
        todo = list(range(len(tasks)))
        with self._database() as conn:
            for _ in range(MAX_SUBMIT_ROUNDS):
                created = store.submit_tasks(conn, _as_json([tasks[i] for i in todo]))
                held = self._settle_created(tasks, todo, created, results)
                if not held:
                    return results
                todo = self._settle_held(conn, tasks, held, results)
                if not todo:
                    return results
        keys = ", ".join(quote(tasks[i].unique_key) for i in todo[:3])
        raise OperationalError(f"unique_key {keys}: the task holding it kept finishing while "
                               f"this submit looked it up; submit again")

    @staticmethod
    def _settle_created(tasks: list[NewTask], todo: list[int],
                        created: set[tuple[str, str | None]],
                        results: list[SubmittedId | None]) -> list[int]:
        """Settle the tasks of this round that were created, or whose id was taken; return
        those with a unique key that were not created, whose reason is still unknown."""
        taken: set[tuple[str, str | None]] = set()
        held = []
        for i in todo:
            task = tasks[i]
            landed = (task.id, task.unique_key)
            # The first copy of an (id, key) in the batch is the one that landed.
            if landed in created and landed not in taken:
                taken.add(landed)
                results[i] = SubmittedId(task.id, True)
            elif task.unique_key is None:
                results[i] = SubmittedId(task.id, False)
            else:
                held.append(i)
        return held

    @staticmethod
    def _settle_held(conn, tasks: list[NewTask], held: list[int],
                     results: list[SubmittedId | None]) -> list[int]:
        """Name the task each of these stands for: its own id if that exists, else the live
        holder of its key. Return those whose holder finished before it could be named: the
        key is free again, so they are inserted again."""
        existing, holders = store.find_submitted(conn, ids=[tasks[i].id for i in held],
                                                 keys=[tasks[i].unique_key for i in held])
        again = []
        for i in held:
            task = tasks[i]
            if task.id in existing:
                results[i] = SubmittedId(task.id, False)
            elif task.unique_key in holders:
                results[i] = SubmittedId(holders[task.unique_key], False)
            else:
                again.append(i)
        return again
