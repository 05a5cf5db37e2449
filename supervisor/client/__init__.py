"""The Python client: submit tasks, inspect them (with their failed attempts), cancel and
retry them, one by one or by filter, and list the daemons.

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

from ..task_fields import (MAX_DELAY_SECONDS, MAX_ID_LENGTH, MAX_NAME_LENGTH,
                           MAX_PAUSED_BY_LENGTH, MAX_UNIQUE_KEY_LENGTH, SUBMIT_FIELDS, NewTask,
                           prepare_task, serialize_payload)
from .browse import Browsing, ListFilter, Page
from .bulk import (DEFAULT_BULK_BATCH, MAX_BULK_BATCH, BulkOperating, BulkOutcome,
                   TaskFilter)
from .connection import DEFAULT_CONNECT_TIMEOUT, ClientConnection
from .daemons import DAEMON_STATES, DEFAULT_DAEMONS_LIMIT, MAX_DAEMONS_LIMIT, Daemons
from .operate import (CANCELLABLE_STATUSES, DEFAULT_LIST_LIMIT, FAILED_ATTEMPTS_KEPT,
                      MAX_LIST_LIMIT, RETRYABLE_STATUSES, STATUSES, Operating, TaskNotFound,
                      TaskStateError, check_status, who_pauses)
from .submit import MAX_SUBMIT_ROUNDS, SubmittedId, Submitting

__all__ = [
    "CANCELLABLE_STATUSES", "DAEMON_STATES", "DEFAULT_BULK_BATCH", "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_DAEMONS_LIMIT", "DEFAULT_LIST_LIMIT", "FAILED_ATTEMPTS_KEPT", "MAX_BULK_BATCH",
    "MAX_DAEMONS_LIMIT", "MAX_DELAY_SECONDS", "MAX_ID_LENGTH", "MAX_LIST_LIMIT",
    "MAX_NAME_LENGTH", "MAX_PAUSED_BY_LENGTH", "MAX_SUBMIT_ROUNDS", "MAX_UNIQUE_KEY_LENGTH",
    "RETRYABLE_STATUSES", "STATUSES", "SUBMIT_FIELDS", "BulkOutcome", "Client", "ListFilter",
    "NewTask", "Page", "SubmittedId", "TaskFilter", "TaskNotFound", "TaskStateError",
    "check_status", "prepare_task", "serialize_payload", "who_pauses",
]


class Client(Submitting, Operating, BulkOperating, Daemons, Browsing, ClientConnection):
    """Submit and manage tasks over one connection.

    Not for concurrent use by several threads (they would share one transaction state):
    give each thread its own client.
    """
