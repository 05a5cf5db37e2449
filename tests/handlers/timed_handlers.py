"""Handlers that record every execution outside the database under test.

Each run appends two lines to the file named by ``payload.log``: ``start <task id> <pid>
<monotonic>`` when the handler begins and ``end ...`` when it returns. CLOCK_MONOTONIC is one
clock for every process of a host, so a test can check that no two runs of a task overlapped,
whatever happened to the database meanwhile (tests/executions.py reads the file). Lines are
single O_APPEND writes, so concurrent runs never tear each other's.
"""

import asyncio
import ctypes
import logging
import os
import signal
import time


def _log(task, what: str) -> None:
    line = f"{what} {task.id} {os.getpid()} {time.monotonic():.6f}\n".encode()
    fd = os.open(task.payload["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def sleeps(task):
    """Runs for ``payload.seconds`` (default 1), releasing the GIL as ordinary code does."""
    _log(task, "start")
    time.sleep(float(task.payload.get("seconds", 1)))
    _log(task, "end")


# libc's sleep() called through PyDLL keeps the GIL for the whole call, as a long regex, a
# compression call or a native library can: no other thread of this process runs meanwhile.
_HOLD_THE_GIL = ctypes.PyDLL(None).usleep


def holds_the_gil(task):
    """Runs for ``payload.seconds`` without ever letting another thread of its process run."""
    _log(task, "start")
    _HOLD_THE_GIL(int(float(task.payload.get("seconds", 1)) * 1_000_000))
    _log(task, "end")


def works(task):
    """Runs ``payload.seconds`` (a retry: ``payload.retry_seconds`` if given), checking at
    safe points: once the task is no longer its own (cancelled, or its lease lapsed by the
    worker's clock) it logs its end and stops."""
    _log(task, "start")
    seconds = task.payload.get("seconds", 1)
    if task.retry_count and "retry_seconds" in task.payload:
        seconds = task.payload["retry_seconds"]
    deadline = time.monotonic() + float(seconds)
    try:
        while time.monotonic() < deadline:
            task.raise_if_cancelled()
            time.sleep(0.01)
    finally:
        _log(task, "end")


def gated(task):
    """Runs until the file ``payload.gate`` exists (at most 30 s), so a test decides when
    the task behind it in a batch would start."""
    _log(task, "start")
    deadline = time.monotonic() + 30
    while not os.path.exists(task.payload["gate"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    _log(task, "end")


def stops_itself(task):
    """Stops its own child with SIGSTOP the moment it starts, as a stop from outside would at
    an instant the test knows: every thread of the child halts until a SIGCONT. Then it
    returns at once."""
    _log(task, "start")
    os.kill(os.getpid(), signal.SIGSTOP)
    _log(task, "end")


async def sleeps_async(task):
    """``sleeps`` for an event loop: waits ``payload.seconds`` without holding it."""
    _log(task, "start")
    await asyncio.sleep(float(task.payload.get("seconds", 1)))
    _log(task, "end")


async def gated_async(task):
    """``gated`` for an event loop: waits for the file ``payload.gate`` (at most 30 s)."""
    _log(task, "start")
    deadline = time.monotonic() + 30
    while not os.path.exists(task.payload["gate"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    _log(task, "end")


async def works_async(task):
    """``works`` for an event loop: checks at safe points and stops once the task is no
    longer its own."""
    _log(task, "start")
    deadline = time.monotonic() + float(task.payload.get("seconds", 1))
    try:
        while time.monotonic() < deadline:
            task.raise_if_cancelled()
            await asyncio.sleep(0.01)
    finally:
        _log(task, "end")


async def chatty_async(task):
    """Logs through the standard library around an await, as application code does."""
    logging.getLogger("app").warning("before %s", task.id)
    await asyncio.sleep(float(task.payload.get("seconds", 0.2)))
    logging.getLogger("app").warning("after %s", task.id)


def chatty(task):
    """``chatty_async`` for a thread."""
    logging.getLogger("app").warning("before %s", task.id)
    time.sleep(float(task.payload.get("seconds", 0.2)))
    logging.getLogger("app").warning("after %s", task.id)
