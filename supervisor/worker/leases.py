"""Who renews a worker's leases, and how the worker hears about them.

In the daemon, the supervisor renews every lease its children hold (supervisor/lease_keeper.py),
from outside the handler's interpreter, so a handler that holds the GIL cannot starve its
own lease. The child tells it what it claimed and settled over the link; an inbox thread
applies what the supervisor answers: renewals, lost claims and wake-ups.

A worker run on its own (``pgtaskd worker``, the tests) gets a LeaseKeeper thread in its own
process instead, through the same keeper code, with the GIL caveat that implies.
"""

from __future__ import annotations

import heapq
import os
import select
import threading
import time
from typing import Protocol, Sequence

from ..channel import Link, claim_packets
from ..claim_board import CLAIMED, FINISHED, STARTED, ClaimBoard, NoBoard
from ..config import Config
from ..lease_keeper import Held, LeaseKeeper
from .task import Task


class LeaseHolder(Protocol):
    """The worker's side of lease renewal."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def hold(self, tasks: Sequence[Task], tokens: Sequence[int]) -> bool:
        """Have these claims renewed; False if that cannot be arranged (do not run them)."""

    def drop(self, tokens: Sequence[int]) -> None:
        """These claims are settled: stop renewing them."""

    def starting(self, token: int) -> None:
        """This claim is about to start: from here on, should the worker die, the claim is
        charged an attempt. Said before the worker's last look at whether the claim is
        still its own (Worker.may_start)."""

    def started(self, task: Task, token: int, *, watched: bool) -> None:
        """The handler of this claim starts now; ``watched``: its type has a timeout or
        cancel: kill, which the supervisor enforces."""

    def finished(self, token: int) -> None:
        """This claim's handler succeeded; its completion is not written yet."""

    def idle(self, since: float) -> None:
        """Nothing was due at ``since``; the worker now waits for a wake-up or a poll."""

    def report_settled(self) -> None:
        """Tell the supervisor now of the claims settled so far, rather than with the next
        message: for claims given back while the worker is busy, which another worker may
        claim again before this one says anything."""

    def refresh(self) -> None:
        """Apply now whatever the supervisor sent that was not read yet (a claim it took
        back): read before a claim's handler starts."""

    def wait(self, timeout: float, woken: threading.Event) -> None:
        """Block until ``woken`` is set, ``interrupt()`` is called, or ``timeout`` passes."""

    def interrupt(self) -> None:
        """End a ``wait`` now (safe to call from a signal handler)."""


class WorkerHooks(Protocol):
    def on_renewed(self, tokens: Sequence[int], expires_at: float) -> None: ...

    def on_lost(self, token: int, reason: str, timed_out: bool = False) -> None: ...

    def on_wake(self) -> None: ...

    def on_stop(self) -> None: ...


class SupervisedLeases:
    """A daemon child's side: the supervisor renews, an inbox thread listens.

    Settled claims are reported with the child's next message (its next claims, or the
    "idle" that says it found none) rather than one message each: a message costs the
    supervisor a wake-up, and renewing a claim its owner already settled is harmless (the
    keeper sees the owner's token on the finished row and forgets the claim).
    """

    def __init__(self, link: Link, worker: WorkerHooks, *, pool_name: str,
                 board: ClaimBoard | NoBoard | None = None):
        self.link = link
        self.worker = worker
        self.pool_name = pool_name
        # Where each claim's state is written for the supervisor to read if this child dies;
        # slot i holds the i-th claim of the current batch.
        self.board = board or NoBoard()
        # token -> its slot, for the claims not settled yet. A slot is free again once its
        # claim settled: the word left there names a token whose final write landed, which the
        # supervisor's token-conditioned settling would leave as it is.
        self._slots: dict[int, int] = {}
        self._free_slots = list(range(self.board.slots))
        self._slots_lock = threading.Lock()  # claims come from the loop, settlements from any
        # The claim whose run the supervisor was told of ("started": its type has a timeout or
        # cancel: kill) until it is told the run is over: it enforces the type's timeout on
        # whatever the child does until then.
        self._watched: int | None = None
        self._settled: list[int] = []
        self._settled_lock = threading.Lock()  # the loop and its batch guard both report
        self._read_lock = threading.Lock()
        # The inbox thread reads only while the worker is busy: an idle worker waits on the
        # link itself, so a wake-up reaches it without a hop through another thread.
        self._busy = threading.Event()
        self._busy.set()
        self._interrupt_r, self._interrupt_w = _pipe()
        self._park_r, self._park_w = _pipe()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="inbox", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._send_settled()
        self._stopping = True
        self._busy.set()
        _poke(self._park_w)
        if self._thread.ident is not None:  # run_once() never starts it
            self._thread.join(2.0)

    def hold(self, tasks: Sequence[Task], tokens: Sequence[int]) -> bool:
        claims = [[task.id, token, task.task_type] for task, token in zip(tasks, tokens)]
        settled = self._take_settled()
        unsent = list(settled)  # what the supervisor must still hear of, should a send fail
        for fields in claim_packets(claims, settled):
            if not self.link.send("claimed", **fields):
                # The caller gives every claim back; those the supervisor took are dropped
                # from its keeper with the next message.
                with self._settled_lock:
                    self._settled.extend(unsent)
                return False
            if fields["done"]:
                unsent.clear()
            unsent.extend(token for _, token, _ in fields["claims"])
        with self._slots_lock:
            for token in tokens:
                # Lowest free first: a lone batch always fills slots 0..n-1.
                slot = heapq.heappop(self._free_slots) if self._free_slots else -1
                self._slots[token] = slot
                self.board.mark(slot, token, CLAIMED)
        return True

    def starting(self, token: int) -> None:
        with self._slots_lock:
            self.board.mark(self._slots.get(token, -1), token, STARTED)

    def started(self, task: Task, token: int, *, watched: bool) -> None:
        if not watched:
            return
        with self._slots_lock:
            self._watched = token
        self.link.send("started", token=token, task_id=task.id, task_type=task.task_type,
                       at=time.monotonic())

    def finished(self, token: int) -> None:
        with self._slots_lock:
            self.board.mark(self._slots.get(token, -1), token, FINISHED)
        self._ended([token])

    def drop(self, tokens: Sequence[int]) -> None:
        with self._slots_lock:
            for token in tokens:
                slot = self._slots.pop(token, -1)
                if slot >= 0:
                    heapq.heappush(self._free_slots, slot)
        with self._settled_lock:
            self._settled.extend(tokens)
        self._ended(tokens)

    def _ended(self, tokens: Sequence[int]) -> None:
        """Tell the supervisor at once that the watched run is over. Its settlement would
        only ride on the next claim: the batch's next task would run meanwhile under the
        ended run's deadline, and be killed as if it had overrun."""
        with self._slots_lock:
            if self._watched is None or self._watched not in tokens:
                return
            token, self._watched = self._watched, None
        self.link.send("ended", token=token)

    def idle(self, since: float) -> None:
        self.link.send("idle", since=since, done=self._take_settled())

    def _take_settled(self) -> list[int]:
        with self._settled_lock:
            settled, self._settled = self._settled, []
        return settled

    def wait(self, timeout: float, woken: threading.Event) -> None:
        fd = self.link.fileno()
        deadline = time.monotonic() + timeout
        self._busy.clear()
        # Get the inbox thread out of its select, so that a wake-up wakes this thread alone.
        _poke(self._park_w)
        try:
            while not woken.is_set() and fd >= 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    readable, _, _ = select.select([fd, self._interrupt_r], [], [], left)
                except (OSError, ValueError):
                    self._unlinked()
                    return
                if self._interrupt_r in readable:
                    _empty(self._interrupt_r)
                    return
                if readable and not self._drain():
                    self._unlinked()
                    return
        finally:
            self._busy.set()

    def interrupt(self) -> None:
        _poke(self._interrupt_w)

    def _send_settled(self) -> None:
        settled = self._take_settled()
        if settled:
            self.link.send("done", tokens=settled)

    def report_settled(self) -> None:
        settled = self._take_settled()
        if settled and not self.link.send("done", tokens=settled):
            with self._settled_lock:
                self._settled.extend(settled)  # with the next message, then

    def refresh(self) -> None:
        """Apply whatever the supervisor sent and the inbox thread has not read yet."""
        self._drain()

    def _run(self) -> None:
        fd = self.link.fileno()
        while fd >= 0 and not self._stopping:
            self._busy.wait()
            try:
                readable, _, _ = select.select([fd, self._park_r], [], [])
            except (OSError, ValueError):
                self._unlinked()
                return
            if self._park_r in readable:
                _empty(self._park_r)
            elif readable and self._busy.is_set() and not self._drain():
                self._unlinked()
                return

    def _unlinked(self) -> None:
        """The link is gone: the supervisor exited, or a handler closed the descriptor. No
        claim could be renewed again, so the child stops after what it runs."""
        if not self._stopping:
            self.worker.on_stop()

    def _drain(self) -> bool:
        with self._read_lock:
            messages, open_ = self.link.receive()
            for message in messages:
                self._apply(message)
        return open_

    def _apply(self, message: dict) -> None:
        kind = message.get("kind")
        if kind == "wake":
            self.worker.on_wake()
        elif kind == "lease":
            self.worker.on_renewed(message.get("tokens") or [], float(message["expires_at"]))
        elif kind == "stop":
            # Also sent as SIGTERM, which a handler may have set to SIG_IGN.
            self.worker.on_stop()
        elif kind == "lost":
            self.worker.on_lost(message["token"], str(message.get("reason") or "lost"),
                                bool(message.get("timed_out")))


class LocalLeases:
    """A worker without a supervisor renews through a keeper thread of its own."""

    def __init__(self, dsn: str, config: Config, worker: WorkerHooks, *, worker_id: str,
                 pool_name: str):
        self.worker = worker
        self.worker_id = worker_id
        self.pool_name = pool_name
        self.label = worker_id
        self.lease = config.lease
        self.keeper = LeaseKeeper(dsn, renew_interval=config.lease.renew_interval,
                                  retry=config.retry,
                                  connect_timeout=config.database.connect_timeout,
                                  application_name=f"pgtaskd {pool_name} leases")
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            self.keeper.start()

    def stop(self) -> None:
        if self._started:
            self.keeper.stop()

    def hold(self, tasks: Sequence[Task], tokens: Sequence[int]) -> bool:
        self.start()
        self.keeper.hold([Held(task.id, token, task.task_type, self.worker_id, self.pool_name,
                               holder=self, lease_seconds=self.lease.seconds,
                               renew_interval=self.lease.renew_interval)
                          for task, token in zip(tasks, tokens)])
        return True

    def drop(self, tokens: Sequence[int]) -> None:
        self.keeper.drop(tokens)

    def starting(self, token: int) -> None:
        pass  # the keeper of this process dies with it: nobody settles for a dead worker

    def started(self, task: Task, token: int, *, watched: bool) -> None:
        pass  # no supervisor: timeouts and cancel-kills are not enforced (pgtaskd worker)

    def finished(self, token: int) -> None:
        pass  # the keeper of this process dies with it: nobody settles for a dead worker

    def idle(self, since: float) -> None:
        pass

    def report_settled(self) -> None:
        pass  # its keeper is told of each settlement as it happens

    def refresh(self) -> None:
        pass  # its keeper's news reaches the tasks directly

    def wait(self, timeout: float, woken: threading.Event) -> None:
        woken.wait(timeout)

    def interrupt(self) -> None:
        pass  # Worker.stop() sets the event wait() waits on

    # -- the keeper's Holder interface ---------------------------------------------------------

    def alive(self) -> bool:
        return True

    def renewed(self, tokens: list[int], expires_at: float) -> None:
        self.worker.on_renewed(tokens, expires_at)

    def lost(self, token: int, reason: str) -> None:
        self.worker.on_lost(token, reason)


def _pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    return read_fd, write_fd


def _poke(fd: int) -> None:
    try:
        os.write(fd, b"x")
    except (BlockingIOError, OSError):
        pass


def _empty(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
