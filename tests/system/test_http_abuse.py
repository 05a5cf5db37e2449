"""Hostile HTTP clients must not hurt the daemon (real daemons, real sockets to 127.0.0.1).

- 1,000 idle connections held open: the supervisor's descriptors stay bounded, /healthz still
  answers, tasks still complete, a killed child is still replaced, and the descriptors come
  back when the clients leave;
- a slow client (one header byte a second) and an idle one are cut after the request
  timeout, and an oversized request head is refused;
- 1,000 concurrent GETs of /metrics: each one is answered or refused cleanly (never left to
  time out), the daemon stays up and its stderr carries no traceback;
- the supervisor raises its own open-files limit, and its children get neither the raised
  limit nor the listening socket.

The tests use the default metrics settings (64 connections, 5 s request timeout).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import add_task, wait_until
from daemon import Daemon, listening_socket_inode, nofile_limits, open_fds
from pgcluster import free_port

pytestmark = pytest.mark.slow

# The request timeout the daemon uses by default, and what a cut may take beyond it.
REQUEST_TIMEOUT = 5.0
CUT_SLACK = 3.0
# What the supervisor may hold beyond its idle count under a flood: the 64 connections of the
# cap, the one being refused, and slack for a restarted child's pipe and a database
# reconnect. Far below the 1,000 clients.
FD_GROWTH_BOUND = 100


pytest_plugins = ["daemon"]


def metrics_daemon(start_daemon, **overrides) -> Daemon:
    port = free_port()
    return start_daemon(pools={"default": {"processes": 1}},
                        metrics={"listen": f"127.0.0.1:{port}"}, **overrides)


def healthz_within(d: Daemon, deadline: float) -> dict:
    """/healthz answers 200 before ``deadline`` seconds pass; its body."""
    last = None

    def answered():
        nonlocal last
        try:
            last = d.healthz()
        except OSError as exc:
            last = (None, repr(exc))
        return last[0] == 200

    wait_until(answered, deadline, interval=0.1,
               message=f"/healthz to answer 200 (last: {last})")
    return last[1]


def task_completes(d: Daemon, conn, task_id: str, timeout: float = 20.0) -> None:
    add_task(conn, task_id, "echo")
    wait_until(lambda: conn.execute("SELECT status FROM tasks WHERE id = %s",
                                    (task_id,)).fetchone()[0] == "COMPLETED",
               timeout, message=f"{task_id} to complete\n{d.log_tail()}")


def no_tracebacks(d: Daemon) -> None:
    d.refresh()
    text = d.log_path.read_text(errors="replace")
    assert "Traceback" not in text, "a traceback reached stderr:\n" + "\n".join(
        line for line in text.splitlines() if not line.startswith("{"))[:3000]


class FdSampler:
    """Samples a process's descriptor count every 50 ms in a thread; keeps the peak."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = len(open_fds(pid))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, len(open_fds(self.pid)))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def test_a_thousand_idle_connections_leave_the_daemon_working(start_daemon, conn):
    # The usual default soft limit: 1,000 idle connections used to exhaust it.
    d = metrics_daemon(start_daemon, nofile=(1024, 4096))
    healthz_within(d, 10)
    baseline = len(open_fds(d.pid))
    child = d.children()[0]
    clients: list[socket.socket] = []
    with FdSampler(d.pid) as fds:
        try:
            for _ in range(1000):
                sock = socket.socket()
                sock.settimeout(2)
                try:
                    sock.connect(("127.0.0.1", d.metrics_port))
                except OSError:
                    sock.close()
                    continue
                clients.append(sock)
            assert len(clients) >= 900, f"only {len(clients)} of 1000 clients connected"

            healthz_within(d, 10)
            task_completes(d, conn, "during-flood")
            # A child restart opens descriptors in the supervisor's main loop.
            mark = d.mark()
            os.kill(child, signal.SIGKILL)
            d.wait_for("worker_booted", since=mark, timeout=20)
            task_completes(d, conn, "after-restart")
            assert d.returncode() is None
            assert fds.peak - baseline <= FD_GROWTH_BOUND, (
                f"descriptors grew from {baseline} to {fds.peak} with 1000 idle clients")
        finally:
            for sock in clients:
                sock.close()
    wait_until(lambda: len(open_fds(d.pid)) <= baseline + 5, 15, interval=0.1,
               message=f"descriptors back to {baseline} (now {len(open_fds(d.pid))})")
    healthz_within(d, 5)
    no_tracebacks(d)


def _cut_after(sock: socket.socket, trickle: bytes, limit: float) -> float | None:
    """Send ``trickle`` one byte a second until the server closes the connection; how long
    that took, or None if it stayed open for ``limit`` seconds."""
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < limit:
        # Waits up to a second for the server to close; the wait paces the trickle too.
        readable, _, _ = select.select([sock], [], [], 1.0)
        if readable:
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - started
            except ConnectionError:
                return time.monotonic() - started
            continue  # an answer before the request was complete: read on until the close
        if sent < len(trickle):
            try:
                sock.send(trickle[sent:sent + 1])
            except ConnectionError:
                return time.monotonic() - started
            sent += 1
    return None


def test_slow_and_idle_clients_are_cut_and_oversized_requests_refused(start_daemon):
    d = metrics_daemon(start_daemon)
    healthz_within(d, 10)
    address = ("127.0.0.1", d.metrics_port)
    slow = socket.create_connection(address, timeout=2)
    idle = socket.create_connection(address, timeout=2)
    try:
        # Slowloris: a request head that never ends, one byte a second.
        trickle = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 100
        took = _cut_after(slow, trickle, REQUEST_TIMEOUT + CUT_SLACK)
        assert took is not None, f"a slow client was still connected after {took} s"
        assert took >= REQUEST_TIMEOUT - 1.5, f"cut after {took:.1f} s, before the timeout"
        # The idle one connected at the same time, so its time is up too.
        took = _cut_after(idle, b"", CUT_SLACK)
        assert took is not None, "an idle client was still connected"
    finally:
        slow.close()
        idle.close()

    with socket.create_connection(address, timeout=5) as big:
        big.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n")
        answer = b""
        try:
            while chunk := big.recv(65536):
                answer += chunk
        except ConnectionError:
            pass
    assert answer.startswith(b"HTTP/1.1 431") or answer == b"", answer[:200]
    healthz_within(d, 5)
    assert d.returncode() is None
    no_tracebacks(d)


def _get(port: int, path: str, timeout: float) -> tuple[str, str]:
    """One GET on a raw socket: ("ok", status), ("refused", why), ("timeout", where) or
    ("bad", what): a refusal is a refused or reset connection, or a close before any byte."""
    got = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            while chunk := sock.recv(65536):
                got += chunk
    except TimeoutError:
        return "timeout", f"after {len(got)} bytes"
    except ConnectionError as exc:
        if not got:
            return "refused", type(exc).__name__
        return "bad", f"{type(exc).__name__} after {len(got)} bytes"
    if not got:
        return "refused", "closed"
    head, _, body = got.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    length = next((int(line.split(":", 1)[1]) for line in lines
                   if line.lower().startswith("content-length:")), None)
    if length != len(body):
        return "bad", f"{lines[0]!r}: {len(body)} body bytes, Content-Length {length}"
    status = lines[0].split()[1]
    return ("ok" if status in ("200", "503") else "bad"), status


def test_a_thousand_concurrent_scrapes_are_answered_or_refused_cleanly(start_daemon):
    d = metrics_daemon(start_daemon)
    healthz_within(d, 10)
    go = threading.Event()

    def scrape(_):
        go.wait()
        return _get(d.metrics_port, "/metrics", timeout=10)

    with ThreadPoolExecutor(max_workers=1000) as pool:
        futures = [pool.submit(scrape, i) for i in range(1000)]
        go.set()
        results = [f.result() for f in futures]
    outcomes: dict[str, int] = {}
    for kind, _ in results:
        outcomes[kind] = outcomes.get(kind, 0) + 1
    unclean = [r for r in results if r[0] not in ("ok", "refused")]
    assert not unclean, f"{outcomes}; e.g. {unclean[:5]}"
    assert outcomes.get("ok", 0) >= 50, outcomes
    assert d.returncode() is None
    healthz_within(d, 5)
    no_tracebacks(d)


def test_the_supervisor_raises_its_fd_limit_and_children_inherit_neither_it_nor_the_socket(
        start_daemon):
    d = metrics_daemon(start_daemon, nofile=(1024, 4096))
    healthz_within(d, 10)
    assert nofile_limits(d.pid) == (4096, 4096)
    listener = f"socket:[{listening_socket_inode(d.metrics_port)}]"
    assert listener in open_fds(d.pid)
    for child in d.children():
        assert listener not in open_fds(child), f"child {child} holds the HTTP socket"
        assert nofile_limits(child) == (1024, 4096), f"child {child}: {nofile_limits(child)}"
