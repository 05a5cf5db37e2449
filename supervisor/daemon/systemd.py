"""The sd_notify protocol: a datagram on the unix socket systemd names in $NOTIFY_SOCKET.

A few lines instead of a dependency. Without the variable (not under systemd) every call is a
no-op. The children never talk to systemd: the arbiter scrubs these variables from their
environment.
"""

from __future__ import annotations

import os
import socket
import time

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
