"""Handlers for the recovery tests (tests/system/test_recovery.py): runs that overrun, burn
CPU, hold memory, and leave processes behind. Each records its run in ``test_runs`` first."""

import subprocess
import sys
import time

from basic import _record

_KEPT = []  # memory a handler "leaks" on purpose: it stays with the child


def overrun(task):
    """Sleeps ``payload.seconds`` without ever checking is_cancelled()."""
    _record(task)
    time.sleep(float(task.payload.get("seconds", 60)))


def overrun_cooperatively(task):
    """Runs ``payload.seconds`` but stops at a safe point once told to."""
    _record(task)
    deadline = time.monotonic() + float(task.payload.get("seconds", 60))
    while time.monotonic() < deadline:
        task.raise_if_cancelled()
        time.sleep(0.02)


def burn(task):
    """Spends ``payload.cpu`` seconds of CPU and holds ``payload.mb`` MiB while it runs."""
    _record(task)
    block = bytearray(int(task.payload.get("mb", 0)) * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1  # touch every page, so it is resident
    until = time.process_time() + float(task.payload.get("cpu", 0))
    while time.process_time() < until:
        pass


def leak(task):
    """Keeps ``payload.mb`` MiB for good (like a handler with a growing cache)."""
    _record(task)
    block = bytearray(int(task.payload.get("mb", 50)) * 1024 * 1024)
    for i in range(0, len(block), 4096):
        block[i] = 1
    _KEPT.append(block)


def abandon(task):
    """Starts a subprocess and, with ``payload.detach``, a detached grandchild (double fork,
    new session), writes their pids to ``payload.pids`` and returns without waiting."""
    _record(task)
    child = subprocess.Popen(["sleep", "300"])
    pids = [child.pid]
    if task.payload.get("detach"):
        script = ("import os, subprocess, sys\n"
                  "p = subprocess.Popen(['sleep', '300'], start_new_session=True,\n"
                  "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
                  "print(p.pid, flush=True)\n")
        grandchild = subprocess.run([sys.executable, "-c", script], capture_output=True,
                                    text=True, check=True)
        pids.append(int(grandchild.stdout))
    with open(task.payload["pids"], "w") as out:
        out.write(" ".join(map(str, pids)))
