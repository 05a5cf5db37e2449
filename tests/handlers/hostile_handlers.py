"""Handlers that do to their own child what an application's code might: ignore SIGTERM,
close every descriptor it did not open. Each logs its runs like timed_handlers."""

import os
import signal
import subprocess
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


def _lines(path: str) -> int:
    try:
        with open(path) as pids:
            return len(pids.read().split())
    except FileNotFoundError:
        return 0


def _sleeper(pidfile: str) -> list[str]:
    """A shell that writes its pid to ``pidfile`` and becomes ``sleep 600``."""
    return ["sh", "-c", f'echo $$ >> "{pidfile}"; exec sleep 600']


def leaves_processes(task):
    """Starts three processes and returns without waiting for any: one from a thread of its
    own, one as the background child of a shell that then becomes another program
    (``sh -c 'x & exec y'``), one in a session of its own (setsid). Each writes its pid to
    ``payload.pids``; then the handler sleeps ``payload.seconds``."""
    pids = task.payload["pids"]
    _log(task, "start")
    started = threading.Thread(target=subprocess.Popen, args=(_sleeper(pids),))
    started.start()
    started.join()
    inner = " ".join(_sleeper(pids)[:2]) + " '" + _sleeper(pids)[2].replace("'", "") + "'"
    subprocess.Popen(["sh", "-c", f'echo $$ >> "{pids}"; {inner} & exec sleep 600'])
    subprocess.Popen(_sleeper(pids), start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _lines(pids) < 4:
        time.sleep(0.01)  # each shell has written its pid: the leftovers all exist
    time.sleep(float(task.payload.get("seconds", 0)))
    _log(task, "end")
