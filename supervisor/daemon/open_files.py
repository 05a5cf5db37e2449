"""The supervisor's open-files limit: raised for itself, given back to its children."""

from __future__ import annotations

import logging
import resource

from ..logs import emit

# The supervisor raises its own open-files soft limit to the hard limit, but not past this:
# a hard limit of "infinity" or 2^30 is not a number of descriptors anyone means to use.
MAX_OPEN_FILES = 65536


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (at most MAX_OPEN_FILES).

    Why: the supervisor holds a pipe per child, database connections and the HTTP server's
    connections, and the usual soft limit is 1024. Running out in the main loop (a child
    restart that cannot open its pipe) stops all work at once; the HTTP server is bounded,
    but the limit is the last line. The soft limit stays low by default only for programs
    that select() (FD_SETSIZE is 1024); the arbiter loop uses poll(), and the children get
    the old limit back (restore_open_files_limit). Returns the limits we started with, for
    the children, or None if nothing changed.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, MAX_OPEN_FILES)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        emit("open_files_limit_kept", logging.WARNING, soft=soft, hard=hard, error=str(exc))
        return None
    emit("open_files_limit_raised", soft=target, was=soft, hard=hard)
    return soft, hard


def restore_open_files_limit(pid: int, limits: tuple[int, int] | None) -> None:
    """Give a child the open-files limit the supervisor started with: its lease thread and
    its handlers may select(), which fails on descriptors past 1023. Done right after the
    child started (there is no rlimit argument to Popen, and a preexec_fn is unsafe in a
    threaded parent); the few descriptors Python opens meanwhile fit either limit."""
    if limits is None:
        return
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
    except (OSError, ValueError):
        pass  # the child is already gone, or we may not: it keeps the raised limit
