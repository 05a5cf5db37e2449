"""Final writes that survive a dropped connection: retried, and safe to retry.

A final write (a completion, a failure, a release) is conditioned on the claim's fencing
token, so repeating it can never touch a task someone else owns. If a commit went through but
its answer was lost, the retry changes no row; the token the owner's write leaves on the row
then tells that earlier landed write apart from a real loss of ownership.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from ..db import store
from ..db.deadline import within
from ..errors import one_line
from ..logs import emit

DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout)
# The longest one statement of the loop may wait for an answer before its connection is cut
# and the statement retried on another (a peer that acknowledges TCP but never answers).
STATEMENT_DEADLINE = 10.0


class AlreadyWritten:
    """Our own final write landed on an earlier try whose answer the connection lost."""

    def __init__(self, row: dict):
        self.row = row
        self.tokens = {row["lease_token"]}

    def __bool__(self) -> bool:
        return True


def write_final(pool: ConnectionPool, write: Callable, claim: store.Claim, fields: dict, *,
                patience: float):
    """Run ``write(conn)``, retrying through connection failures for up to ``patience``
    seconds; its result, AlreadyWritten, or None once given up (logged final_state_lost)."""
    deadline = time.monotonic() + patience
    delay = 0.1
    attempt = 0
    while True:
        attempt += 1
        try:
            with pool.connection() as conn, within(conn, STATEMENT_DEADLINE):
                result = write(conn)
                if attempt > 1 and not result and not isinstance(result, set):
                    row = store.task_status(conn, claim.task_id)
                    if row and row["lease_token"] == claim.token \
                            and row["status"] not in ("RUNNING", "CANCELLED"):
                        result = AlreadyWritten(row)
        except DB_ERRORS as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                emit("final_state_lost", logging.ERROR, error=one_line(exc, typed=True),
                     attempts=attempt, **fields)
                return None
            # Once per write, not once per try: an outage would repeat it every few seconds.
            if attempt == 1:
                emit("final_write_retry", logging.WARNING, error=one_line(exc, typed=True),
                     patience=round(left, 1), **fields)
            time.sleep(min(delay, left))
            # At most a second apart: the write lands within a second of the database's
            # return, before the lease it holds runs out and another worker runs the task
            # again. A try is one refused connection while the server is away.
            delay = min(delay * 2, 1.0)
            continue
        if attempt > 1:
            emit("final_write_recovered", attempts=attempt, **fields)
        return result
