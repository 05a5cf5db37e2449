"""Handlers that do to their own child what an application's code might: ignore SIGTERM,
close every descriptor it did not open. Each logs its runs like timed_handlers."""

import os
import signal
import threading
import time

from timed_handlers import _log


def ignores_sigterm(task):
    """Sets SIGTERM to SIG_IGN for the whole child (a library's own signal setup does), then
    runs for ``payload.seconds``."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _log(task, "start")
    time.sleep(float(task.payload.get("seconds", 0)))
    _log(task, "end")


def closes_descriptors(task):
    """Closes every descriptor above stderr (a daemonizing library does), the child's link to
    its supervisor among them, then runs for ``payload.seconds``."""
    _log(task, "start")
    os.closerange(3, 4096)
    time.sleep(float(task.payload.get("seconds", 0)))
    _log(task, "end")


def leaves_a_thread(task):
    """Starts a thread that is not a daemon thread and returns: the child's interpreter
    cannot exit while it runs."""
    _log(task, "start")
    threading.Thread(target=time.sleep, args=(600,), name="left behind").start()
    _log(task, "end")
