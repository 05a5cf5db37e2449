"""The parent-child pipe: one JSON object per line, child to parent.

Messages (``kind`` and its fields):
  booted   pid, worker_id, task_types    handlers imported and the database reached
  claimed  task_id, token, task_type     the child now owns this claim
  done     task_id, outcome              the claim is settled (or dropped as stale)
  stopping reason                        the child leaves its loop and will exit

The parent uses ``claimed``/``done`` to know which claim each child holds, so it can rescue a
dead child's task at once, and later to enforce hard timeouts and account per-task usage.
Writes are single ``os.write`` calls under PIPE_BUF (4096 bytes), so they are atomic.
"""

from __future__ import annotations

import json
import os
import threading

MAX_MESSAGE = 4096


class ChildChannel:
    """The child's end: write-only and thread-safe; a dead parent is not the child's error."""

    def __init__(self, fd: int | None):
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, kind: str, **fields) -> None:
        if self.fd is None:
            return
        line = json.dumps({"kind": kind, **fields}, default=str, separators=(",", ":")) + "\n"
        data = line.encode()
        if len(data) > MAX_MESSAGE:
            # Only a huge task id (inserted by hand past the client's limit) gets here. The
            # run must go on: without this message the supervisor cannot rescue the claim
            # early, and its lease expiry is the fallback.
            return
        with self._lock:
            try:
                os.write(self.fd, data)
            except (BrokenPipeError, OSError):
                self.fd = None


class LineReader:
    """The parent's end of one child's pipe: feed it bytes, get whole decoded messages."""

    def __init__(self):
        self._buffer = b""

    def feed(self, data: bytes) -> list[dict]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > 4 * MAX_MESSAGE:
            # No newline in far more than any message: not our protocol; drop it rather
            # than let the arbiter's memory grow.
            self._buffer = b""
        messages = []
        for line in lines:
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue  # a torn or foreign line must not kill the arbiter
            if isinstance(message, dict) and "kind" in message:
                messages.append(message)
        return messages
