"""Handlers for the system tests (tests/system): real faults inside real worker children.

Each records its run in ``test_runs`` (created by tests/conftest.py in every test database)
before doing anything else, so a test can count the runs and see which process made them.
"""

import os
import signal
import time

from basic import _record


def suicide(task):
    """Kill this worker child with SIGKILL, every time (like the OOM killer would)."""
    _record(task)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # never reached: SIGKILL cannot be caught


def suicide_later(task):
    """Sleep ``payload.seconds``, then kill this worker child with SIGKILL, every time."""
    _record(task)
    time.sleep(float(task.payload.get("seconds", 1)))
    os.kill(os.getpid(), signal.SIGKILL)


def slow_once(task):
    """The first attempt sleeps ``payload.seconds`` (default 60); later attempts return at once."""
    _record(task)
    if task.attempts <= 1:
        time.sleep(float(task.payload.get("seconds", 60)))


def slow(task):
    """Every attempt sleeps ``payload.seconds`` (default 60); ignores SIGTERM like busy code."""
    _record(task)
    time.sleep(float(task.payload.get("seconds", 60)))
