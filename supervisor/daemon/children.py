"""The supervisor's worker children: starting one, what it is doing, how it ended, and when
to start it again.

Children start as fresh interpreters (``python -m supervisor.worker.main``) through
subprocess, which forks and execs at once: a bare fork of the threaded supervisor could copy
a lock some other thread holds. A fresh interpreter is also what makes SIGHUP load new
handler code. Each child runs in a process group of its own, so killing it kills whatever
its handler started too.
"""

from __future__ import annotations

import collections
import logging
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from . import systemd
from ..channel import Link, socket_pair
from ..claim_board import ClaimBoard
from ..config import CONFIG_SNAPSHOT_ENV, DSN_ENV, Config
from ..logs import emit
from ..process_tree import WORKER_OF_ENV

# A child that does not say "booted" within this long is killed and counts as a boot failure.
BOOT_TIMEOUT = 60.0
# Restart backoff per slot: doubles per consecutive early death, capped, with jitter.
RESTART_BASE_DELAY = 0.1
RESTART_MAX_DELAY = 30.0
# A child that lived this long resets its slot's backoff.
STABLE_AFTER = 10.0
# Fuse: this many boot failures within the window stop a pool's restarts.
FUSE_FAILURES = 5
FUSE_WINDOW = 60.0

# /proc/<pid>/stat states of a process that makes progress (running, sleeping, disk wait,
# idle kernel wait); T/t (stopped, traced) and Z/X (dead) do not.
_PROGRESSING = frozenset("RSDIWP")
# Stopped by a signal (SIGSTOP, SIGTSTP) or held by a debugger: alive, but running nothing.
_STOPPED = frozenset("Tt")


# A child asked to stop that holds no claim has nothing left to finish; one still there after
# this cannot leave (a thread its handler started keeps the interpreter from exiting) or did
# not hear the request, and is killed rather than left running until the daemon stops.
IDLE_STOP_GRACE = 5.0
# How long a child whose link closed while it lives may finish what it runs: it can report
# nothing, so it is stopped and then killed; its claims are renewed until then, so that no
# other worker can start them while it may still be running them.
UNHEARD_GRACE = 5.0
# A link seen closed this long before the child is seen gone was not closed by its exit.
UNHEARD_AFTER = 0.5


class ClaimedTask(NamedTuple):
    """A task a child told us it claimed."""
    task_id: str
    task_type: str


@dataclass(eq=False)
class Child:
    process: subprocess.Popen
    pool: str
    slot: int
    generation: int
    link: Link
    task_types: frozenset[str] = frozenset()
    # The config of its generation: its claims are renewed by that config's lease settings
    # even after a reload changed them.
    config: Config | None = None
    started: float = field(default_factory=time.monotonic)
    booted: bool = False
    worker_id: str | None = None
    # token -> the task of every claim it holds (the lease keeper holds the claims themselves,
    # for renewal).
    claims: dict[int, ClaimedTask] = field(default_factory=dict)
    # What the child wrote of each claim's state, read when it is gone (claim_board.py).
    board: ClaimBoard | None = None
    stopping: str | None = None  # why it was asked to stop: "shrink", "reload", "shutdown"
    kill_at: float | None = None  # when a stopping child gets SIGKILL (None: never)
    stop_asked: float | None = None  # when it was asked to stop
    link_closed_at: float | None = None  # when its link was seen closed, the child alive
    unheard: bool = False  # retired because its link closed
    stop_grace: float | None = None  # the grace it was given when asked to stop
    killed_by_us: bool = False
    boot_error: str | None = None
    waiting_db: bool = False  # booting, but waiting out a database outage: not stuck
    # Monotonic time of the claim that found nothing, while the child waits for work; None
    # while it works (or was just woken).
    idle_since: float | None = None
    # The run it reported starting, for a type with a timeout or cancel: kill (run_policies.py).
    running: object | None = None
    claimed_any: bool = False
    exited_at: float = 0.0  # monotonic, when we reaped it
    timeout_reason: str | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def label(self) -> str:
        return f"{self.pool}#{self.slot}"

    def task_in_hand(self) -> str | None:
        """The task it runs (when its type is watched), else the first it holds (for logs)."""
        if self.running is not None:
            return self.running.task_id
        return next((held.task_id for held in self.claims.values()), None)

    def holding(self, task_id: str) -> int | None:
        """The token under which it holds this task, if it does."""
        return next((t for t, held in self.claims.items() if held.task_id == task_id), None)

    def handles(self, task_types: Sequence[str] | None) -> bool:
        return task_types is None or not self.task_types.isdisjoint(task_types)

    # -- the lease keeper's Holder interface (called from its thread) ------------------------

    def alive(self) -> bool:
        """Making progress: not exited, not stopped. Read from /proc without waiting."""
        return self._state() in _PROGRESSING

    def stopped(self) -> bool:
        """Alive but stopped (SIGSTOP, a debugger): it runs nothing until it is let go."""
        return self._state() in _STOPPED

    def _state(self) -> str:
        """Its state letter in /proc/<pid>/stat; "X" once it exited or cannot be read."""
        if self.process.returncode is not None:
            return "X"
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return "X"
        return fields[0].decode(errors="replace") if fields else "X"

    def renewed(self, tokens: list[int], expires_at: float) -> None:
        self.link.send("lease", tokens=tokens, expires_at=expires_at)

    def lost(self, token: int, reason: str) -> bool:
        """Whether the message could be sent."""
        return self.link.send("lost", token=token, reason=reason)

    def wake(self) -> None:
        self.idle_since = None
        self.link.send("wake")


def child_command(pool: str, slot: int, channel_fd: int, board_fd: int,
                  config: Config) -> list[str]:
    command = [sys.executable, "-m", "supervisor.worker.main", "--pool", pool,
               "--slot", str(slot), "--channel-fd", str(channel_fd),
               "--claims-fd", str(board_fd), "--supervisor-pid", str(os.getpid())]
    if config.path:
        command += ["-c", str(config.path)]
    return command


def child_environment(config: Config, *, dsn: str, metrics_dir: str) -> dict[str, str]:
    env = systemd.child_environment(dict(os.environ))
    env[DSN_ENV] = dsn
    env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    env[WORKER_OF_ENV] = str(os.getpid())
    # The config text this generation was loaded from: a child restarted after the file was
    # edited (or broken) without a reload must not pick up the file as it is now.
    env.pop(CONFIG_SNAPSHOT_ENV, None)
    if config.source is not None:
        env[CONFIG_SNAPSHOT_ENV] = config.source
    return env


def spawn_child(config: Config, pool: str, slot: int, generation: int, *, dsn: str,
                metrics_dir: str) -> Child | None:
    """Start one worker child, or log why it could not be started and return None."""
    pool_config = next((p for p in config.pools if p.name == pool), None)
    try:
        parent_end, child_end = socket_pair()
    except OSError as exc:
        emit("worker_spawn_failed", logging.ERROR, pool=pool, slot=slot, error=str(exc))
        return None
    try:
        board = ClaimBoard.create(pool_config.board_slots if pool_config else 1)
    except OSError as exc:
        parent_end.close()
        child_end.close()
        emit("worker_spawn_failed", logging.ERROR, pool=pool, slot=slot, error=str(exc))
        return None
    try:
        process = subprocess.Popen(
            child_command(pool, slot, child_end.fileno(), board.fd, config),
            pass_fds=(child_end.fileno(), board.fd),
            env=child_environment(config, dsn=dsn, metrics_dir=metrics_dir),
            stdin=subprocess.DEVNULL, close_fds=True,
            # A process group per child: killing a child kills what its handler started
            # too, so no orphaned subprocess keeps working on a task that runs again.
            start_new_session=True)
    except (OSError, subprocess.SubprocessError) as exc:
        parent_end.close()
        board.close()
        emit("worker_spawn_failed", logging.ERROR, pool=pool, slot=slot, error=str(exc))
        return None
    finally:
        child_end.close()
    types = frozenset(pool_config.task_types) if pool_config else frozenset()
    child = Child(process, pool, slot, generation, Link(parent_end, blocking=False), types,
                  config=config, board=board)
    emit("worker_spawned", pool=pool, slot=slot, child_pid=process.pid, generation=generation)
    return child


# Signals a child sends itself when its own code is broken (a crashing native import):
# unlike SIGKILL or SIGTERM from outside (the OOM killer, an operator), they say the child
# cannot boot.
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL,
                            signal.SIGFPE})


def _failed_to_boot(child: Child, code: int) -> bool:
    """Whether a child that died before booting counts toward its pool's fuse: it exited
    with an error, crashed, or the supervisor killed it for not booting in time. A child
    killed from outside while it booted was not at fault: it only gets the backoff."""
    if child.boot_error is not None or code > 0:
        return True
    return code < 0 and -code in _CRASH_SIGNALS


def kill_group(child: Child) -> None:
    """SIGKILL the child and everything its handler started (its process group)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def signal_name(code: int | None) -> str | None:
    """The signal a process died of (SIGKILL, ...) by its return code, or None."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def describe_exit(code: int, *, sent_by_us: bool = False) -> str:
    if code >= 0:
        return f"exit code {code}"
    name = signal_name(code)
    if sent_by_us:
        return f"{name} (sent by the supervisor)"
    if -code == signal.SIGKILL:
        return f"{name} (possibly the OOM killer)"
    return name


@dataclass
class SlotState:
    failures: int = 0
    next_start: float = 0.0


@dataclass
class PoolState:
    boot_failures: collections.deque = field(default_factory=collections.deque)
    fused: bool = False
    last_error: str | None = None


class RestartPolicy:
    """When a slot may start a child again, and when a pool stops trying (the fuse).

    Backoff doubles per consecutive early death of a slot, with jitter, so a crash loop does
    not spin; a child only counts as started once it said "booted", and boot failures of a
    pool within FUSE_WINDOW blow its fuse until a reload re-arms it.
    """

    def __init__(self):
        self.slots: dict[tuple[str, int], SlotState] = collections.defaultdict(SlotState)
        self.pools: dict[str, PoolState] = collections.defaultdict(PoolState)

    def reset(self) -> None:
        self.slots.clear()
        self.pools.clear()

    def may_start(self, pool: str, slot: int, now: float) -> bool:
        return not self.pools[pool].fused and self.slots[(pool, slot)].next_start <= now

    def next_starts(self, now: float) -> list[float]:
        return [s.next_start for s in self.slots.values() if s.next_start > now]

    def fused_pools(self) -> tuple[str, ...]:
        return tuple(sorted(name for name, state in self.pools.items() if state.fused))

    def child_exited(self, child: Child, how: str, lived: float, code: int = 1) -> None:
        now = time.monotonic()
        slot = self.slots[(child.pool, child.slot)]
        # A child that lived long, or claimed work, was not in a crash loop (an OOM kill, an
        # operator): the next one starts at the first step of the backoff again.
        stable = lived >= STABLE_AFTER or child.claimed_any
        slot.failures = 1 if stable else slot.failures + 1
        delay = min(RESTART_BASE_DELAY * 2 ** (slot.failures - 1), RESTART_MAX_DELAY)
        slot.next_start = now + delay * (1 + random.random() * 0.25)
        if child.booted or not _failed_to_boot(child, code):
            return
        # It never booted: a broken handler import, a bad config. Count toward the fuse.
        state = self.pools[child.pool]
        state.boot_failures.append(now)
        state.last_error = child.boot_error or how
        while state.boot_failures and now - state.boot_failures[0] > FUSE_WINDOW:
            state.boot_failures.popleft()
        if len(state.boot_failures) >= FUSE_FAILURES and not state.fused:
            state.fused = True
            emit("pool_fused", logging.CRITICAL, pool=child.pool,
                 error=f"{len(state.boot_failures)} workers failed to boot within "
                       f"{FUSE_WINDOW:g} s; restarts stopped until a reload (SIGHUP). "
                       f"Last: {state.last_error}")

