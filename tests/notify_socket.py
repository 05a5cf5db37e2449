"""A stand-in for systemd's notify socket, for tests of the daemon's sd_notify messages and
watchdog pings."""

from __future__ import annotations

import socket
import threading
import time
import uuid


class NotifySocket:
    """An sd_notify socket (abstract, so no path length limit) read by a thread."""

    def __init__(self):
        self.name = f"pgtaskd-test-{uuid.uuid4().hex[:12]}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    @property
    def env(self) -> dict[str, str]:
        # Watchdog pings every 0.5 s: one per turn of the arbiter loop at most.
        return {"NOTIFY_SOCKET": "@" + self.name, "WATCHDOG_USEC": "1000000"}

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode(errors="replace")))

    def pings(self) -> list[float]:
        return [at for at, text in list(self.messages) if "WATCHDOG=1" in text.split("\n")]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def longest_gap(times: list[float], start: float, end: float) -> float:
    points = [start] + [t for t in times if start < t < end] + [end]
    return max(b - a for a, b in zip(points, points[1:]))
