"""A small HTTP server that hostile or broken clients cannot exhaust.

The supervisor's /metrics and /healthz used to run on ThreadingHTTPServer: a thread and a
descriptor per connection, forever, with a listen backlog of 5. A thousand idle connections
took a thousand descriptors, and the next child restart in the arbiter loop found none left.

Here one asyncio loop in one thread owns every connection, so an idle or slow client costs a
descriptor and a few hundred bytes, never a thread, and:

- at most ``max_connections`` connections are open; past it, a new connection takes the place
  of the oldest one that has sat for a while without sending its whole request, or is
  closed at once when there is none, so a flood of idle sockets cannot starve a scraper;
- each connection has ``request_timeout`` seconds to send its request head (a total, so a
  client trickling one byte a second is cut too) and as long again to take the answer;
- a request head is at most HEAD_LIMIT bytes (431 past it); one GET per connection;
- answers that take work run on a fixed pool of RENDER_THREADS threads; quick ones run on
  the loop, so /healthz answers while scrapes queue;
- a failure is at most one JSON line a minute (``http_error``), never a traceback: the
  clients' own faults (resets, timeouts, garbage) are only counted in
  ``pgtaskd_http_connections_dropped_total``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from ..logs import emit

# The kernel queues this many finished handshakes while the loop is busy (it was 5).
BACKLOG = 128
HEAD_LIMIT = 8192
RENDER_THREADS = 2
# A connection that sent no complete request for this long may lose its place to a new one;
# a younger one is a client still on its way, which a burst of new ones must not push out.
EVICT_AFTER = 1.0
ERROR_LOG_INTERVAL = 60.0
STOP_PATIENCE = 5.0
ACCEPT_RETRY_DELAY = 0.5

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True)
class Route:
    answer: Callable[[], Response]
    blocking: bool = False
    """True: ``answer`` does real work (reads files) and runs on a render thread."""


class _Connection:
    """One accepted socket; its transport once the streams are made."""

    __slots__ = ("sock", "transport", "accepted")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.transport: asyncio.Transport | None = None
        self.accepted = time.monotonic()

    def abort(self) -> None:
        """Close now, without flushing: nothing is left to send to a client we drop, and a
        close could wait on a client that stopped reading."""
        if self.transport is not None:
            self.transport.abort()
        else:
            self.sock.close()


class BoundedHTTPServer:
    def __init__(self, address: tuple[str, int], routes: dict[str, Route], *,
                 max_connections: int, request_timeout: float,
                 on_drop: Callable[[str], None] = lambda reason: None):
        self.routes = routes
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.on_drop = on_drop
        # Bound here, in the caller's thread, so that a port in use fails the start. Python
        # makes it non-inheritable (PEP 446): no worker child ever holds the listening port.
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.sock = socket.create_server(address, family=family, backlog=BACKLOG)
        self.sock.setblocking(False)
        self.address = self.sock.getsockname()[:2]
        self._open: set[_Connection] = set()
        # The open connections still sending their request, oldest first: the evictable.
        self._waiting: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        self._tasks: set[asyncio.Task] = set()
        self._renders = ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="http-render")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._errors_logged_at = float("-inf")
        self._errors_unlogged = 0
        self.thread = threading.Thread(target=self._run, name="http", daemon=True)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Close every connection and the port. Never raises: it runs in the arbiter's
        shutdown path, which must not fail because of a socket."""
        try:
            loop = self._loop
            if loop is not None and self._stopped is not None:
                loop.call_soon_threadsafe(self._stopped.set)
            self.thread.join(STOP_PATIENCE)
            self._renders.shutdown(wait=False, cancel_futures=True)
            self.sock.close()
        except Exception as exc:
            self.log_error("stopping the HTTP server failed", exc)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except Exception as exc:  # the port is lost, the daemon carries on without it
            self.log_error("the HTTP server stopped", exc)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(self._loop_error)
        self._stopped = asyncio.Event()
        accepting = asyncio.create_task(self._accept_forever())
        await self._stopped.wait()
        accepting.cancel()
        for conn in list(self._open):
            self._forget(conn)
            conn.abort()

    async def _accept_forever(self) -> None:
        """Accept one connection at a time and admit it or close it at once, so that the
        descriptors held never pass max_connections + 1 (asyncio.start_server would accept
        a whole backlog and make its transports before we could say no)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self.sock)
            except (ConnectionAbortedError, InterruptedError):
                continue
            except OSError as exc:  # out of descriptors: leave them to the arbiter a while
                self.log_error("accept() failed", exc)
                await asyncio.sleep(ACCEPT_RETRY_DELAY)
                continue
            conn = _Connection(sock)
            if self._admit(conn):
                task = asyncio.create_task(self._connection(conn))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                sock.close()
                self.on_drop("over_capacity")
            await asyncio.sleep(0)  # a flood of connects must not starve the admitted ones

    def _admit(self, conn: _Connection) -> bool:
        """Make room for a new connection under max_connections, or say there is none."""
        if len(self._open) >= self.max_connections:
            oldest = next(iter(self._waiting), None)
            if oldest is None or conn.accepted - oldest.accepted < EVICT_AFTER:
                return False
            self._forget(oldest)
            oldest.abort()
            self.on_drop("evicted")
        self._open.add(conn)
        self._waiting[conn] = None
        return True

    def _forget(self, conn: _Connection) -> None:
        self._waiting.pop(conn, None)
        self._open.discard(conn)

    # -- one connection -----------------------------------------------------------------------

    async def _connection(self, conn: _Connection) -> None:
        try:
            if conn not in self._open:  # the server stopped before this task ran
                return
            reader, writer = await asyncio.open_connection(sock=conn.sock, limit=HEAD_LIMIT)
            conn.transport = writer.transport
            if conn not in self._open:  # evicted or stopped meanwhile
                return
            response = await self._read_and_answer(reader, conn)
            if response is not None:
                writer.write(self._encode(response))
                # close() sends what is buffered, then the FIN; drain() would return while up
                # to 64 KiB were still buffered, and the abort below would cut them off.
                writer.close()
                await asyncio.wait_for(writer.wait_closed(), self.request_timeout)
        except TimeoutError:
            self.on_drop("timeout")
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client left or was evicted: nothing to answer
        except Exception as exc:
            self.log_error("answering a request failed", exc)
        finally:
            self._forget(conn)
            conn.abort()  # after a clean close, a no-op; else the client is cut off now

    async def _read_and_answer(self, reader: asyncio.StreamReader,
                               conn: _Connection) -> Response | None:
        left = conn.accepted + self.request_timeout - time.monotonic()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), max(left, 0.0))
        except asyncio.LimitOverrunError:
            self.on_drop("too_large")
            return Response(431, "text/plain", b"request head too large\n")
        except asyncio.IncompleteReadError:
            return None  # closed before a whole request: a port scan, a health probe
        self._waiting.pop(conn, None)  # a whole request: no longer evictable
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            self.on_drop("bad_request")
            return Response(400, "text/plain", b"bad request\n")
        method, target = parts[0], parts[1].decode("latin-1")
        if method != b"GET":
            return Response(405, "text/plain", b"only GET\n")
        route = self.routes.get(target.split("?", 1)[0])
        if route is None:
            names = " or ".join(sorted(self.routes))
            return Response(404, "text/plain", f"not found: try {names}\n".encode())
        if route.blocking:
            return await asyncio.get_running_loop().run_in_executor(self._renders, route.answer)
        return route.answer()

    @staticmethod
    def _encode(response: Response) -> bytes:
        head = (f"HTTP/1.1 {response.status} {REASONS.get(response.status, '')}\r\n"
                f"Content-Type: {response.content_type}\r\n"
                f"Content-Length: {len(response.body)}\r\n"
                "Connection: close\r\nServer: pgtaskd\r\n\r\n")
        return head.encode("latin-1") + response.body

    # -- errors -------------------------------------------------------------------------------

    def _loop_error(self, loop, context: dict) -> None:
        """asyncio's own reports (accept() out of descriptors, a callback that raised)."""
        exc = context.get("exception")
        if isinstance(exc, asyncio.CancelledError):
            return  # connections still open when we stop: their handlers are cancelled
        self.log_error(context.get("message", "asyncio error"), exc)

    def log_error(self, what: str, exc: BaseException | None) -> None:
        """One line, at most once a minute, with how many were left unlogged meanwhile."""
        now = time.monotonic()
        if now - self._errors_logged_at < ERROR_LOG_INTERVAL:
            self._errors_unlogged += 1
            return
        emit("http_error", logging.WARNING, what=what,
             error=None if exc is None else repr(exc)[:300],
             unlogged_before=self._errors_unlogged or None)
        self._errors_logged_at = now
        self._errors_unlogged = 0
