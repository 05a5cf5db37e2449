"""What a run cost, and what it left behind.

``RunMeter`` measures each run's CPU time (user and system, of the worker process and of the
subprocesses it waited for) and its peak resident memory. The peak is per run: the kernel's
high-water mark is reset before the handler starts (writing 5 to /proc/self/clear_refs)
and read after (getrusage), which costs a few microseconds, not a read of /proc/self/status.
Subprocesses' memory is not in that peak.

``kill_leftovers`` ends the processes a handler started and left running, and theirs: a run
must not outlive its task (process_tree.py).
"""

from __future__ import annotations

import os
import resource

from ..process_tree import kill_children


class RunMeter:
    def __init__(self):
        try:
            self._clear_refs: int | None = os.open("/proc/self/clear_refs", os.O_WRONLY)
        except OSError:
            self._clear_refs = None  # not Linux, or not allowed: the peak is the process's

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
        """SIGKILL and reap every process the handler left, and what they started."""
        return kill_children()


def current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime
