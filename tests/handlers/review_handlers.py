"""Handlers for the review regression tests (tests/integration/test_review_regressions.py and
tests/system/test_daemon_faults.py): handler shapes that must be refused, error messages
PostgreSQL cannot store as they are, and a handler that starts a subprocess of its own.
"""

import os
import subprocess

from supervisor import PermanentError

SENT = []  # what the async handlers would have done, had anybody awaited them


# -- shapes that are not plain functions: refused when the handlers are loaded ---------------


async def async_send(task):
    SENT.append(task.id)


def generator_send(task):
    yield task.id
    SENT.append(task.id)


async def async_generator_send(task):
    yield task.id
    SENT.append(task.id)


# -- plain functions that return unrun work: refused when they run --------------------------


async def _send_later(task):
    SENT.append(task.id)


def returns_coroutine(task):
    """Looks like a plain function; calling it runs none of the work."""
    return _send_later(task)


def returns_generator(task):
    return (SENT.append(i) for i in (task.id,))


# -- error messages PostgreSQL text cannot hold as they are --------------------------------


def nul_error(task):
    raise ValueError("bad record: b'\x00abc' in row 7")


def nul_permanent(task):
    raise PermanentError("bad record: b'\x00abc' in row 7")


def surrogate_error(task):
    # A file name that is not UTF-8, as os.listdir() returns it on Linux.
    name = os.fsdecode(b"report-\xff.csv")
    raise ValueError(f"cannot export {name}")


# -- a handler that starts a subprocess of its own -------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            raw = handle.read()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2:].split()[0] != "Z"


def spawn_sleeper(task):
    """Start ``sleep`` (like a handler shelling out to rsync or ffmpeg) and wait for it.

    Before starting its own, it notes which sleepers of earlier runs of the same task are
    still alive, and records both in the ``sleepers`` table the test created.
    """
    with task.connection() as conn:
        earlier = [pid for (pid,) in conn.execute(
            "SELECT sleeper_pid FROM sleepers WHERE task_id = %s", (task.id,))]
        alive_before = [pid for pid in earlier if _alive(pid)]
    sleeper = subprocess.Popen(["sleep", str(task.payload.get("seconds", 60))],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    with task.connection() as conn:
        conn.execute("INSERT INTO sleepers (task_id, attempt, worker_pid, sleeper_pid, "
                     "alive_before) VALUES (%s, %s, %s, %s, %s)",
                     (task.id, task.attempts, os.getpid(), sleeper.pid, alive_before))
    sleeper.wait()
