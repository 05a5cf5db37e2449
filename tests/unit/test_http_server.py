"""The bounded HTTP server on its own (supervisor/maintenance/http_server.py): real sockets to
127.0.0.1, no daemon."""

from __future__ import annotations

import socket

import pytest

from conftest import wait_until
from supervisor.maintenance.http_server import BoundedHTTPServer, Response, Route

# More than the kernel takes at once with a small send buffer (as on a path to a distant
# scraper), and what is left is under asyncio's high-water mark (64 KiB): drain() returns at
# once with it still buffered.
BIG = b"x" * (60 * 1024)


@pytest.fixture
def server():
    drops: list[str] = []
    routes = {"/big": Route(lambda: Response(200, "text/plain", BIG), blocking=True),
              "/small": Route(lambda: Response(200, "text/plain", b"ok\n"))}
    srv = BoundedHTTPServer(("127.0.0.1", 0), routes, max_connections=4, request_timeout=10,
                            on_drop=drops.append)
    srv.drops = drops
    srv.start()
    yield srv
    srv.stop()


def test_an_answer_larger_than_the_socket_buffers_arrives_whole(server):
    # Small buffers on both ends, as on a path to a distant scraper: loopback's defaults
    # take megabytes at once, and would hide an answer cut off while still buffered.
    # Accepted sockets inherit the listener's send buffer; the client announces its window
    # in the handshake.
    server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(server.address)
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"Content-Length: %d" % len(BIG) in head
    assert len(body) == len(BIG)


def test_answers_and_refusals(server):
    def ask(raw: bytes) -> bytes:
        with socket.create_connection(server.address, timeout=5) as sock:
            sock.sendall(raw)
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
        return got.split(b"\r\n", 1)[0]

    assert ask(b"GET /small HTTP/1.1\r\n\r\n") == b"HTTP/1.1 200 OK"
    assert ask(b"GET /small?x=1 HTTP/1.0\r\n\r\n") == b"HTTP/1.1 200 OK"
    assert ask(b"GET /nope HTTP/1.1\r\n\r\n") == b"HTTP/1.1 404 Not Found"
    assert ask(b"POST /small HTTP/1.1\r\n\r\n") == b"HTTP/1.1 405 Method Not Allowed"
    assert ask(b"hello\r\n\r\n") == b"HTTP/1.1 400 Bad Request"
    assert ask(b"GET /small HTTP/1.1\r\nX: " + b"x" * 9000 + b"\r\n\r\n") \
        == b"HTTP/1.1 431 Request Header Fields Too Large"


def test_at_the_cap_a_new_client_replaces_an_idle_one_but_not_a_young_one(server):
    idle = [socket.create_connection(server.address) for _ in range(4)]
    try:
        # All four are younger than a second: a fifth is refused.
        with socket.create_connection(server.address, timeout=5) as sock:
            sock.sendall(b"GET /small HTTP/1.1\r\n\r\n")
            try:
                assert sock.recv(100) == b""
            except ConnectionResetError:
                pass
        wait_until(lambda: "over_capacity" in server.drops, 5)

        def served():
            with socket.create_connection(server.address, timeout=5) as sock:
                sock.sendall(b"GET /small HTTP/1.1\r\n\r\n")
                try:
                    return sock.recv(100).startswith(b"HTTP/1.1 200")
                except ConnectionResetError:
                    return False

        # Once the idle ones are a second old, a new client takes the oldest one's place.
        wait_until(served, 5, interval=0.2, message="a new client to be served at the cap")
        assert "evicted" in server.drops
    finally:
        for sock in idle:
            sock.close()


def test_livez_is_503_once_the_supervisors_loop_has_not_turned_for_the_window():
    import json

    from supervisor.maintenance.http import LIVENESS_WINDOW, render_livez

    assert render_livez(lambda: 0.4).status == 200
    stuck = render_livez(lambda: LIVENESS_WINDOW + 1)
    assert stuck.status == 503 and json.loads(stuck.body)["status"] == "stuck"
