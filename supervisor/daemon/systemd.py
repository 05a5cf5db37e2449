"""The sd_notify protocol: a datagram on the unix socket systemd names in $NOTIFY_SOCKET,
and what the supervisor tells systemd over it each turn of its loop (SystemdReport).

A few lines instead of a dependency. Without the variable (not under systemd) every call is a
no-op. The children never talk to systemd: the arbiter scrubs these variables from their
environment.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Iterable

from ..logs import emit

SYSTEMD_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def notify(*fields: str) -> bool:
    """Send ``READY=1``-style fields; True if systemd was told."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(fields).encode())
        return True
    except OSError:
        return False


def reloading() -> bool:
    # systemd 253+ wants MONOTONIC_USEC with RELOADING=1 to match the reload to its request.
    return notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def watchdog_interval() -> float | None:
    """Seconds between watchdog pings (half the configured timeout), or None if not asked."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 1e6 / 2, 0.5)
    except ValueError:
        return None


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """The environment for a worker child: without the systemd notification variables, so a
    child cannot send READY or watchdog pings on the supervisor's behalf."""
    return {k: v for k, v in env.items() if k not in SYSTEMD_ENV}


class SystemdReport:
    """READY=1 once the first children booted, the watchdog pings, and the STATUS= line
    (sent only when it changed)."""

    def __init__(self):
        self.ready_sent = False
        self._last_watchdog = 0.0
        self._last_status = ""

    def send(self, status, children: Iterable, *, stopping: str | None, started_at: float,
             boot_timeout: float, health, reload_failure: str | None = None) -> None:
        """``status`` is the children's ChildrenStatus; ``health`` the health check, if any."""
        now = time.monotonic()
        children = list(children)
        line = f"STATUS={status.live}/{status.expected} workers"
        busy = sum(1 for c in children if c.claims)
        line += f", {busy} busy"
        if status.fused_pools:
            line += f", FUSED: {','.join(status.fused_pools)}"
        if health is not None:
            latest = health.latest()
            line += f", {latest.tasks_by_status.get('PENDING', 0)} pending"
        if reload_failure:
            line += f", RELOAD FAILED: {reload_failure}"
        if not self.ready_sent and not stopping:
            first = [c for c in children if c.generation == 1]
            all_booted = all(c.booted for c in first) and len(first) >= status.expected
            if all_booted or status.fused_pools or now - started_at > boot_timeout:
                self.ready_sent = True
                # One datagram: whoever sees READY also sees what the daemon is ready with.
                self._last_status = line
                notify("READY=1", line)
                emit("supervisor_ready", live=status.live, expected=status.expected,
                     fused_pools=list(status.fused_pools))
        interval = watchdog_interval()
        if interval and now - self._last_watchdog >= interval:
            self._last_watchdog = now
            notify("WATCHDOG=1")
        if line != self._last_status:
            self._last_status = line
            notify(line)
