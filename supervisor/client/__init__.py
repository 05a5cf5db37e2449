"""The Python client: submit tasks, and inspect, cancel and retry them.

    from supervisor import Client

    with Client("postgresql://app@db/pgtaskd") as client:
        task_id = client.submit("email", {"to": "ops@example.com"}, delay=60)

A client given a DSN owns one autocommit connection, opened on first use and reopened if it
breaks. A client given a psycopg connection borrows it: every call runs in whatever
transaction that connection has open, and the client never commits, rolls back or closes it
(short of ``client.transaction()``, which asks for exactly that). That is how an application
enqueues a task atomically with its own writes:

    with app_conn.transaction():
        app_conn.execute("INSERT INTO orders ...")
        Client(app_conn).submit("ship_order", {"order": 42}, task_id="ship-order-42")

Every input is checked before the database is touched; a bad one raises UsageError and
writes nothing. Database trouble raises OperationalError with a one-line message.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
from datetime import datetime, timedelta
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import psycopg

from ..config import MAX_LIMIT, Config, ScheduleConfig, load_config
from ..db import store
from ..db.connect import connect, describe_target
from ..db.session import database_dsn
from ..errors import OperationalError, UsageError, quote
from ..task_fields import (DEFAULT_MAX_PAYLOAD_BYTES, MAX_DELAY_SECONDS, MAX_ID_LENGTH,
                           MAX_NAME_LENGTH, MAX_PAUSED_BY_LENGTH, MAX_TASK_TYPE_LENGTH,
                           MAX_UNIQUE_KEY_LENGTH, SUBMIT_FIELDS, NewTask, check_int,
                           check_label, check_text, kind_of, prepare_task, serialize_payload)

STATUSES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED")
CANCELLABLE_STATUSES = ("PENDING", "RUNNING")
RETRYABLE_STATUSES = ("FAILED", "CANCELLED")

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 10_000
# A submit whose unique key was held when it inserted, by a task that finished before the
# submit could look it up, inserts again: each round needs a holder to finish within
# milliseconds, so a few rounds are plenty.
MAX_SUBMIT_ROUNDS = 5


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



class Client:
    """Submit and manage tasks over one connection.

    Not for concurrent use by several threads (they would share one transaction state):
    give each thread its own client.
    """

    def __init__(self, target: str | psycopg.Connection, *,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 transaction_pooler: bool = False):
        """``target`` is a DSN (the client owns a connection) or a psycopg connection
        (borrowed: calls join its transaction; it is never committed or closed here).
        ``transaction_pooler``: the DSN goes through PgBouncer in transaction mode, so the
        client's connection prepares no statement."""
        if isinstance(target, psycopg.Connection):
            self._setup(dsn=None, conn=target, config=None, max_payload_bytes=max_payload_bytes,
                        connect_timeout=connect_timeout, pooled=transaction_pooler)
        elif isinstance(target, str) and target:
            self._setup(dsn=target, conn=None, config=None, max_payload_bytes=max_payload_bytes,
                        connect_timeout=connect_timeout, pooled=transaction_pooler)
        else:
            raise TypeError(f"Client needs a DSN or a psycopg connection, got {target!r}")

    @classmethod
    def from_config(cls, config: str | os.PathLike | Config | None = None) -> "Client":
        """A client for the database of a pgtaskd config (a path, or None for $PGTASKD_CONFIG).

        Without a DSN there, the embedded PostgreSQL in ``database.data_dir`` is started on
        first use and held until ``close()``.
        """
        if not isinstance(config, Config):
            config = load_config(config)
        client = cls.__new__(cls)
        client._setup(dsn=config.database.dsn, conn=None, config=config,
                      max_payload_bytes=config.max_payload_bytes,
                      connect_timeout=config.database.connect_timeout,
                      pooled=config.database.transaction_pooler)
        return client

    def _setup(self, *, dsn: str | None, conn: psycopg.Connection | None,
               config: Config | None, max_payload_bytes: int, connect_timeout: float,
               pooled: bool) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.connect_timeout = connect_timeout
        self._pooled = pooled
        self._dsn = dsn
        self._conn = conn
        self._owns_connection = conn is None
        # Set by from_config(); without a DSN there, it says where to start the embedded server.
        self._config = config
        self._resources = contextlib.ExitStack()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Close an owned connection and let go of the embedded server; a borrowed one stays."""
        if self._owns_connection and self._conn is not None:
            self._conn.close()
            self._conn = None
        self._resources.close()
        if self._config is not None and not self._config.database.dsn:
            self._dsn = None  # the embedded server's address dies with it

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Make the calls inside one atomic unit: all of them take effect, or none.

        psycopg's ``Connection.transaction()``: a savepoint when the connection already has a
        transaction open (a borrowed one usually does), else a transaction of its own that
        commits when the block ends and rolls back if it raises.
        """
        with self._database() as conn, conn.transaction():
            yield

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
        """The paused task types: ``{"task_type", "paused_at", "paused_by", "due_pending"}``
        each (due_pending: its due tasks, which wait for a resume), by type."""
        with self._database() as conn:
            return store.list_pauses(conn)

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
        """Let every daemon run this type's tasks with no global limit again. False when it
        had none."""
        task_type = _check_lookup_text("task_type", task_type)
        with self._database() as conn:
            return store.remove_task_type_limit(conn, task_type) is not None

    def limits(self) -> list[dict[str, Any]]:
        """The global concurrency limits: ``{"task_type", "max_running", "running",
        "updated_at", "updated_by"}`` each (running: slots a live lease holds now), by type."""
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
        limits()]}``; every status appears in each count, zero or not. Due tasks of paused
        types are counted in paused_due_pending only: due_pending and oldest_pending_age are
        about the tasks that workers may take.
        """
        with self._database() as conn:
            rows = store.count_by_type_and_status(conn)
            summary = store.queue_health(conn)
            pauses = store.list_pauses(conn)
            limits = store.list_limits(conn)
        by_status = dict.fromkeys(STATUSES, 0)
        by_type: dict[str, dict[str, int]] = {}
        for row in rows:
            by_status[row["status"]] += row["count"]
            by_type.setdefault(row["task_type"], dict.fromkeys(STATUSES, 0))[row["status"]] = \
                row["count"]
        return {"total": sum(by_status.values()), "by_status": by_status, "by_type": by_type,
                "due_pending": summary["due_pending"],
                "oldest_pending_age": summary["oldest_pending_age"],
                "expired_leases": summary["expired_leases"],
                "paused_due_pending": summary["paused_due"], "paused_types": pauses,
                "limits": limits}

    def schedule_status(self, schedules: Iterable[ScheduleConfig] | None = None
                        ) -> list[dict[str, Any]]:
        """Each schedule (by default, those of the config this client was made from) with
        when it runs next and when it last ran, in config order.

        ``{"name", "cron", "timezone", "task_type", "catch_up", "next_run", "last_run",
        "last_task_id", "last_status"}``: ``next_run`` is the first instant after the
        database's clock as this config defines the schedule (None if it has none within 50
        years); ``last_run`` the newest instant any daemon enqueued, ``last_task_id`` its
        task and ``last_status`` that task's status (None once it was deleted); the last three
        are None for a schedule that never ran.
        """
        if schedules is None:
            if self._config is None:
                raise UsageError("schedule_status: give the schedules, or make the client "
                                 "with Client.from_config()")
            schedules = self._config.schedules
        schedules = list(schedules)
        with self._database() as conn:
            now = store.database_now(conn)
            runs = store.schedule_runs(conn, [s.name for s in schedules]) if schedules else {}
        status = []
        for schedule in schedules:
            run = runs.get(schedule.name, {})
            status.append({
                "name": schedule.name, "cron": schedule.cron.expression,
                "timezone": schedule.cron.timezone, "task_type": schedule.task_type,
                "catch_up": schedule.catch_up, "next_run": schedule.cron.next_after(now),
                "last_run": run.get("last_enqueued"), "last_task_id": run.get("last_task_id"),
                "last_status": run.get("last_status")})
        return status

    def _connection(self) -> psycopg.Connection:
        if not self._owns_connection:
            return self._conn
        if self._conn is None or self._conn.closed:
            if self._dsn is None:
                self._dsn = self._resources.enter_context(database_dsn(self._config))
            self._conn = connect(self._dsn, connect_timeout=self.connect_timeout,
                                 application_name="pgtaskd client", pooled=self._pooled)
        return self._conn

    def _target(self, conn: psycopg.Connection) -> str:
        if self._dsn:
            return describe_target(self._dsn)
        return f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"

    @contextlib.contextmanager
    def _database(self) -> Iterator[psycopg.Connection]:
        """The connection, with psycopg's errors turned into one-line OperationalErrors."""
        conn = self._connection()
        try:
            yield conn
        except psycopg.errors.UndefinedTable as exc:
            raise OperationalError(f"PostgreSQL at {self._target(conn)} has no pgtaskd schema: "
                                   f"run 'pgtaskd migrate' first") from exc
        except psycopg.Error as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            what = "lost the connection to" if conn.closed else "error from"
            raise OperationalError(f"{what} PostgreSQL at {self._target(conn)}: {reason}") from exc
