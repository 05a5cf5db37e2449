"""``pgtaskd web``: the console on uvicorn, bounded against idle and hostile clients.

uvicorn's own bounds, as set here:
- ``limit_concurrency`` = ``web.max_connections``: past it, a request gets a 503;
- ``timeout_keep_alive`` = ``web.request_timeout``: an idle kept-alive connection is closed;
- ``h11_max_incomplete_event_size`` = HEAD_LIMIT: a request head past 8 KiB is a 400;
- ``backlog`` 128, no ``Server`` header, no proxy headers believed (the console's own
  ``web.auth.trusted_proxies`` decide whom to believe, and for what).

What uvicorn leaves open, ``BoundedH11Protocol`` closes, as the daemon's /metrics does: a
connection that never sends a request is never timed out by uvicorn, nor refused at
``limit_concurrency`` (only its requests are). Here each connection has
``web.request_timeout`` seconds to send a whole request head (a total: a client that
trickles a byte a second is cut too), and as long again plus the database's statement
timeout to take its answer; and at most ``web.max_connections`` are open: a new one past
it takes the place of the oldest that has not sent its request for a second, or is closed.
"""

from __future__ import annotations

import logging
import socket
import time

import psycopg
import uvicorn
from psycopg_pool import ConnectionPool
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..config import Config
from ..db.connect import with_options
from ..db.session import database_dsn
from ..errors import OperationalError, UsageError
from ..logs import emit, setup_logging
from .app import build_app

HEAD_LIMIT = 8192
BACKLOG = 128
EVICT_AFTER = 1.0
STATEMENT_TIMEOUT = 5.0


def make_protocol(max_connections: int, request_timeout: float) -> type:
    answer_timeout = request_timeout + STATEMENT_TIMEOUT + 5.0

    class BoundedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._accepted = time.monotonic()
            self._head_timer = None
            self._answer_timer = None
            self._arm_head_deadline()
            if len(self.connections) > max_connections:
                self._make_room()

        def _make_room(self) -> None:
            now = time.monotonic()
            idle = [c for c in self.connections
                    if c is not self and getattr(c, "_head_timer", None) is not None
                    and now - c._accepted >= EVICT_AFTER]
            victim = min(idle, key=lambda c: c._accepted) if idle else self
            victim.transport.abort()

        def _arm_head_deadline(self) -> None:
            self._cancel_timers()
            self._head_timer = self.loop.call_later(request_timeout, self._too_slow)

        def _cancel_timers(self) -> None:
            for name in ("_head_timer", "_answer_timer"):
                timer = getattr(self, name, None)
                if timer is not None:
                    timer.cancel()
                    setattr(self, name, None)

        def _too_slow(self) -> None:
            self._head_timer = self._answer_timer = None
            if not self.transport.is_closing():
                self.transport.abort()

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before and self.cycle is not None:
                # A whole request head arrived: now its answer has a deadline instead.
                self._cancel_timers()
                self._answer_timer = self.loop.call_later(answer_timeout, self._too_slow)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None
                                                    or self.cycle.response_complete):
                self._arm_head_deadline()
                self._accepted = time.monotonic()

        def connection_lost(self, exc) -> None:
            self._cancel_timers()
            super().connection_lost(exc)

    return BoundedH11Protocol


def open_pool(dsn: str, config: Config) -> ConnectionPool:
    def configure(conn: psycopg.Connection) -> None:
        conn.autocommit = True
        conn.prepare_threshold = None
        if not config.database.transaction_pooler:
            # A page must never hold a lock or a daemon's row for long, nor wait for one.
            conn.execute(f"SET statement_timeout = {int(STATEMENT_TIMEOUT * 1000)}")
            conn.execute("SET lock_timeout = 2000")
            conn.execute("SET jit = off")
            conn.execute("SET TimeZone = 'UTC'")

    return ConnectionPool(
        with_options(dsn, connect_timeout=max(1, int(config.database.connect_timeout)),
                     application_name="pgtaskd web"),
        min_size=1, max_size=config.web.db_connections, configure=configure, open=False,
        timeout=5.0, reconnect_timeout=0, kwargs={"autocommit": True},
        name="pgtaskd-web")


def refuse_exposed(config: Config) -> None:
    if config.web.exposed and not config.web.auth.enabled:
        raise UsageError(f"web.listen: {config.web.listen} is not a loopback address and "
                         f"web.auth sets no users nor proxy_header: refusing to show the "
                         f"queue to anyone who can reach it (set web.auth, or listen on "
                         f"127.0.0.1 behind a proxy)")


def listening_socket(config: Config) -> socket.socket:
    host, port = config.web.address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise OperationalError(f"web.listen {config.web.listen}: cannot listen: "
                               f"{exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def serve(config: Config) -> int:
    """Run the console until SIGTERM or SIGINT; 0 when it stopped as asked."""
    refuse_exposed(config)
    setup_logging()
    # uvicorn's own warnings (a bad request, the concurrency limit) are the clients' doing:
    # under a flood they would be a line each.
    logging.getLogger("uvicorn.error").setLevel(logging.ERROR)
    sock = listening_socket(config)
    with database_dsn(config) as dsn:
        pool = open_pool(dsn, config)
        pool.open(wait=False)
        try:
            app = build_app(config, pool)
            server = uvicorn.Server(uvicorn.Config(
                app, http=make_protocol(config.web.max_connections,
                                        config.web.request_timeout),
                lifespan="off", log_config=None, access_log=False,
                limit_concurrency=config.web.max_connections,
                timeout_keep_alive=config.web.request_timeout,
                h11_max_incomplete_event_size=HEAD_LIMIT, backlog=BACKLOG,
                timeout_graceful_shutdown=5, server_header=False, proxy_headers=False))
            emit("web_listening", listen=config.web.listen, actions=config.web.actions,
                 auth="users" if config.web.auth.users else
                 "proxy" if config.web.auth.proxy_header else "none")
            server.run(sockets=[sock])
        finally:
            pool.close()
            sock.close()
    emit("web_stopped")
    return 0
