"""What a run cost, and what it left behind.

``RunMeter`` measures each run's CPU time (user and system, of the worker process and of the
subprocesses it waited for) and its peak resident memory. The peak is per run: the kernel's
high-water mark is reset before the handler starts (writing 5 to /proc/self/clear_refs)
and read after (getrusage), which costs a few microseconds, not a read of /proc/self/status.
Subprocesses' memory is not in that peak.

``kill_leftovers`` ends the processes a handler started and left running: a run must not
outlive its task. The worker is a child subreaper, so a handler's grandchildren whose parent
exited are its children too, and found the same way.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal

PR_SET_CHILD_SUBREAPER = 36


class RunMeter:
    def __init__(self):
        try:
            self._clear_refs: int | None = os.open("/proc/self/clear_refs", os.O_WRONLY)
        except OSError:
            self._clear_refs = None  # not Linux, or not allowed: the peak is the process's
        self._children_file = f"/proc/{os.getpid()}/task/{os.getpid()}/children"

    def start(self) -> tuple[float, float]:
        if self._clear_refs is not None:
            try:
                os.write(self._clear_refs, b"5")
            except OSError:
                self._clear_refs = None
        return _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)

    def stop(self, started: tuple[float, float]) -> tuple[float, int]:
        """(CPU seconds, peak RSS bytes) since ``start``."""
        own = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (own.ru_utime + own.ru_stime - started[0]) \
            + (_cpu(resource.RUSAGE_CHILDREN) - started[1])
        return round(max(cpu, 0.0), 6), own.ru_maxrss * 1024

    def kill_leftovers(self) -> int:
        """SIGKILL and reap every child process still running; how many there were."""
        try:
            with open(self._children_file) as children:
                pids = [int(pid) for pid in children.read().split()]
        except (OSError, ValueError):
            return 0
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        return len(pids)


def current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def become_subreaper() -> None:
    """Orphaned descendants of this process get it as their parent, not init (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime
