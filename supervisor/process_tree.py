"""The processes a handler started, found by process tree and killed with their descendants.

A worker child and the supervisor are both child subreapers (Linux): what a handler starts and
abandons is reparented to the nearest of them still alive, never to init, where it would
outlive the daemon. Children are listed per thread (/proc/<pid>/task/<tid>/children): a
process started from a handler's thread is that thread's child, not the main thread's.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_CHILD_SUBREAPER = 36
# Set in every worker child's environment, and so inherited by what its handlers start: the
# supervisor kills an orphan reparented to it only when it carries this, with its own pid.
WORKER_OF_ENV = "PGTASKD_WORKER_OF"
# A tree that keeps forking as fast as it is killed is given up on after this many rounds.
MAX_ROUNDS = 20


def become_subreaper() -> None:
    """Orphaned descendants of this process get it as their parent, not init (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass


def children_of(pid: int) -> list[int]:
    """The children of every thread of ``pid``; [] where /proc cannot tell."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as children:
                found += [int(child) for child in children.read().split()]
        except (OSError, ValueError):
            continue
    return found


def has_children() -> bool:
    """Whether any thread of this process has a child, running or not, in one system call:
    the walk of /proc costs some 10 microseconds per thread, after every task."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    found, todo = [], children_of(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children_of(child)
    return found


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it; the caller reaps ``pid``. Descendants are
    listed first, as killing a parent moves its children to a subreaper."""
    for victim in [pid, *descendants(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def kill_children() -> int:
    """SIGKILL and reap every process below this one, including orphans that reach it while
    it kills; how many of its children there were."""
    if not has_children():
        return 0
    me, killed = os.getpid(), 0
    for _ in range(MAX_ROUNDS):
        children = children_of(me)
        if not children:
            break
        for child in children:
            kill_tree(child)
        for child in children:
            reap(child)
        killed += len(children)
    return killed


def kill_orphans(known: set[int]) -> int:
    """SIGKILL and reap each child of this process that a worker child's handler left (it
    carries WORKER_OF_ENV with this pid) and that is not one of ``known``; how many."""
    me = os.getpid()
    marker = f"{WORKER_OF_ENV}={me}".encode()
    killed = 0
    for child in children_of(me):
        if child in known:
            continue
        try:
            with open(f"/proc/{child}/environ", "rb") as environ:
                if marker not in environ.read().split(b"\0"):
                    continue  # ours otherwise (pg_ctl, an embedded server): not to touch
        except OSError:
            continue
        kill_tree(child)
        reap(child)
        killed += 1
    return killed
