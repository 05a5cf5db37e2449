"""Handlers the tests use. Each leaves a trace the test can check in the database."""

import os
import time

from supervisor import PermanentError


def _record(task):
    with task.connection() as conn:
        conn.execute("INSERT INTO test_runs (task_id, worker_id, retry_count, pid) "
                     "VALUES (%s, %s, %s, %s)",
                     (task.id, task.worker_id, task.retry_count, os.getpid()))


def echo(task):
    return task.payload


def record(task):
    """Record the run, optionally after a sleep (payload.sleep seconds)."""
    if task.payload.get("sleep"):
        time.sleep(float(task.payload["sleep"]))
    _record(task)


def fail(task):
    _record(task)
    raise RuntimeError(task.payload.get("message", "boom"))


def permanent(task):
    _record(task)
    raise PermanentError("cannot ever work")


def sleep(task):
    time.sleep(float(task.payload.get("seconds", 1)))


def record_then_sleep(task):
    """Records that it started, so a test can act while the handler surely runs."""
    _record(task)
    time.sleep(float(task.payload.get("seconds", 1)))


def cooperative(task):
    """Runs until cancelled, checking at safe points; records how it stopped."""
    deadline = time.monotonic() + float(task.payload.get("max_seconds", 30))
    while time.monotonic() < deadline:
        task.raise_if_cancelled()
        time.sleep(0.02)


def chatty(task):
    """Prints (one line in two writes, one with no newline at all) and logs through a
    logger of its own: what an unchanged handler does."""
    import logging
    import sys

    print("said", task.payload.get("word", "hi"), end=" ")
    sys.stdout.write("twice\n")
    logging.getLogger("chatty").warning("careful with %s", task.id)
    print("no newline", end="")
