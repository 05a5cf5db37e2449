"""The supervisor-child link: one socketpair per child, one JSON object per packet.

A SOCK_SEQPACKET socketpair keeps message boundaries and delivers each packet whole or not
at all, in both directions, so neither side needs framing and a torn message cannot happen.

Child to supervisor (``kind`` and its fields):
  booted     pid, worker_id, task_types     handlers imported and the database reached
  boot_failed error                         handlers could not be imported
  waiting_db error                          booting, but the database is unreachable
  claimed    claims: [[task_id, token, task_type], ...], done
                                            the child owns these claims: renew them
  started    token, task_id, task_type, at  a run of a type with a timeout or cancel: kill
                                            starts (at monotonic ``at``)
  ended      token                          that run is over (its write may be pending)
  idle       since, done                    nothing was due at monotonic ``since``
  done       tokens: [...]                  settled (or dropped as stale): stop renewing;
                                            ``claimed`` and ``idle`` carry the same list as
                                            ``done``, so the common case costs no message
  stopping   reason                         the child leaves its loop and will exit

Supervisor to child:
  wake                                      due work may be waiting: claim now
  stop                                      finish what runs and exit (as SIGTERM says,
                                            which a handler may have set to SIG_IGN)
  lease      tokens: [...], expires_at      renewed; valid until ``expires_at`` (monotonic)
  lost       token, reason                  the claim is gone (cancelled, or taken over)

Times are ``time.monotonic()`` values: CLOCK_MONOTONIC is one clock for every process of a
host, so a deadline the supervisor computes holds in the child too.
"""

from __future__ import annotations

import json
import socket
import struct
import threading

# Far above any real message; a packet larger than this is refused by send(), not cut.
MAX_PACKET = 256 * 1024
# The longest task id a child reports to its supervisor. A client writes at most 200
# characters; a longer id comes from plain SQL. As JSON one character takes at most 12 bytes,
# so a claim stays under 50 KiB and a batch of them is split over packets (claim_packets).
MAX_LINKED_ID_LENGTH = 4096
# How long the child waits for room in the socket before it gives up on a message: only a
# supervisor that stopped reading (SIGSTOP, a hang) ever makes it wait.
CHILD_SEND_TIMEOUT = 10.0


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(supervisor end, child end). The child end is inheritable, to be passed by fd."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child_end.set_inheritable(True)
    for end in (parent_end, child_end):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_PACKET * 2)
    return parent_end, child_end


def encode(kind: str, fields: dict) -> bytes:
    return json.dumps({"kind": kind, **fields}, default=str, separators=(",", ":")).encode()


def claim_packets(claims: list[list], done: list[int]) -> list[dict]:
    """The fields of "claimed" messages carrying ``claims`` (and ``done`` on the first), each
    under MAX_PACKET: 150 ids of 200 emoji would be 360 KiB in one."""
    packets, current, size = [], [], 0
    budget = MAX_PACKET - 1024 - len(json.dumps(done))
    for claim in claims:
        cost = len(json.dumps(claim, separators=(",", ":"))) + 1
        if current and size + cost > budget:
            packets.append(current)
            current, size, budget = [], 0, MAX_PACKET - 1024
        current.append(claim)
        size += cost
    packets.append(current)
    return [{"claims": chunk, "done": done if i == 0 else []} for i, chunk in enumerate(packets)]


def decode(packet: bytes | memoryview) -> dict | None:
    try:
        message = json.loads(bytes(packet))
    except (ValueError, RecursionError):
        return None  # not our protocol; one bad packet must not kill the reader
    return message if isinstance(message, dict) and "kind" in message else None


class Link:
    """One end of a child's socketpair; ``send`` is thread-safe and never raises.

    ``blocking=False`` (the supervisor's end): a send that finds no room is dropped, since
    every supervisor message is a hint the child can do without (a wake-up, a lease
    extension it will also learn from its own clock). ``blocking=True`` (the child's end):
    a send waits up to CHILD_SEND_TIMEOUT for room, and a False return tells the caller the
    supervisor did not get the message.
    """

    def __init__(self, sock: socket.socket | None, *, blocking: bool):
        self.sock = sock
        self._lock = threading.Lock()
        self._buffer: bytearray | None = None  # for receive(), made on first use
        if sock is None:
            return
        if blocking:
            # A kernel send timeout, not Python's socket timeout: with the latter, every
            # recv() would wait for data first, whatever MSG_DONTWAIT says.
            sock.setblocking(True)
            seconds = int(CHILD_SEND_TIMEOUT)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, 0))
        else:
            sock.setblocking(False)

    @classmethod
    def from_fd(cls, fd: int | None) -> "Link":
        """The child's end, from the fd the supervisor passed on the command line."""
        if fd is None:
            return cls(None, blocking=True)
        return cls(socket.socket(fileno=fd), blocking=True)

    @property
    def closed(self) -> bool:
        return self.sock is None

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def send(self, kind: str, **fields) -> bool:
        sock = self.sock
        if sock is None:
            return False
        data = encode(kind, fields)
        if len(data) > MAX_PACKET:
            return False
        with self._lock:
            try:
                sock.send(data)
                return True
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                # The other end is gone: a dead child, or a supervisor that exited.
                self.sock = None
                return False

    def receive(self) -> tuple[list[dict], bool]:
        """Every packet waiting now, decoded, and whether the other end is still there.

        Never blocks, whatever the socket's own timeout.
        """
        sock = self.sock
        if sock is None:
            return [], False
        messages = []
        if self._buffer is None:
            self._buffer = bytearray(MAX_PACKET)
        view = memoryview(self._buffer)
        while True:
            try:
                # Into one buffer kept for the link: recv(MAX_PACKET) would allocate (and
                # then shrink) 256 KiB for every packet, one per task on a busy child.
                size = sock.recv_into(view, MAX_PACKET, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return messages, True
            except OSError:
                return messages, False
            if not size:
                return messages, False
            message = decode(view[:size])
            if message is not None:
                messages.append(message)

    def close(self) -> None:
        with self._lock:
            sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()
