"""The console's Starlette application: routes, the request's session and database, and how
a page is rendered (whole, or only its live part for an update).

The database is reached through the client only (``Client`` over a connection borrowed from
a small pool), on Starlette's worker threads, one client per request. A bad filter or key is
a 400 naming it, a missing task a 404, a database that cannot answer a 503; a fault of the
console itself is a 500 with one JSON log line, never a traceback on the page.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

import jinja2
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..client import Client, TaskNotFound
from ..config import Config
from ..errors import OperationalError, UsageError, one_line
from ..logs import emit
from .sessions import COOKIE, Session, Sessions

HERE = Path(__file__).resolve().parent
LIVE_HEADER = "x-console-live"
# How long a request waits for one of the console's database connections.
POOL_WAIT = 5.0


class Refused(Exception):
    """An answer other than the page: status and message."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


@dataclass
class Console:
    """What every page and action needs: the config, the pool, the sessions, templates."""

    config: Config
    pool: ConnectionPool
    sessions: Sessions
    templates: jinja2.Environment

    def with_client(self, work: Callable[[Client], Any]) -> Any:
        """Run ``work`` with a client on a pooled connection (on a worker thread)."""
        try:
            with self.pool.connection(timeout=POOL_WAIT) as conn:
                return work(Client(conn, max_payload_bytes=self.config.max_payload_bytes))
        except PoolTimeout:
            raise Refused(503, f"no database connection free within {POOL_WAIT:g} s (the "
                               f"console holds {self.config.web.db_connections}; "
                               f"web.db_connections)") from None

    async def read(self, work: Callable[[Client], Any]) -> Any:
        return await run_in_threadpool(self.with_client, work)

    def session(self, request: Request) -> Session:
        session = request.scope.get("pgtaskd.session")
        if session is None:
            header = self.config.web.auth.proxy_header
            session = self.sessions.load(
                request.cookies.get(COOKIE), request.client.host if request.client else None,
                request.headers.get(header) if header else None)
            request.scope["pgtaskd.session"] = session
        return session

    def can_act(self, session: Session) -> bool:
        return self.config.web.actions and session.user is not None

    def page(self, request: Request, name: str, status: int = 200, **values) -> Response:
        session = self.session(request)
        values.update(user=session.user, csrf=session.csrf, can_act=self.can_act(session),
                      refresh_ms=int(self.config.web.refresh_interval * 1000),
                      path=request.url.path, via_proxy=session.via_proxy,
                      logins=bool(self.config.web.auth.users), notice=_notice(request))
        template = self.templates.get_template(name)
        if request.headers.get(LIVE_HEADER) == "1" and "live" in template.blocks:
            context = template.new_context(values)
            body = "".join(template.blocks["live"](context))
        else:
            body = template.render(values)
        response = HTMLResponse(body, status_code=status,
                                headers={"Cache-Control": "no-store"})
        self.remember(response, session)
        return response

    def remember(self, response: Response, session: Session) -> None:
        if session.fresh:
            response.set_cookie(COOKIE, self.sessions.cookie(session), httponly=True,
                                samesite="strict", path="/",
                                max_age=int(session.expires - time.time()))


NOTICES = {"retried": "Retried: the task is PENDING again, due now.",
           "cancelled": "Cancelled.", "paused": "Paused.", "resumed": "Resumed.",
           "limit-set": "Limit set.", "limit-removed": "Limit removed.",
           "logged-out": "Logged out."}


def _notice(request: Request) -> str | None:
    return NOTICES.get(request.query_params.get("notice", ""))


def templates() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["idurl"] = lambda value: quote(str(value), safe="")
    env.filters["when"] = _when
    env.filters["figure"] = _figure
    env.filters["seconds"] = _seconds
    return env


def _when(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value  # 'infinity', or a year a datetime cannot hold
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _figure(value: int | None, at_least: bool = False) -> str:
    if value is None:
        return "-"
    return f"≥ {value - 1:,}" if at_least else f"{value:,}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    value = float(value)
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value < 120:
        return f"{sign}{value:.1f} s"
    if value < 7200:
        return f"{sign}{value / 60:.1f} min"
    if value < 172800:
        return f"{sign}{value / 3600:.1f} h"
    return f"{sign}{value / 86400:.1f} d"


def build_app(config: Config, pool: ConnectionPool, *, session_key: bytes | None = None
              ) -> Starlette:
    from . import actions, pages

    console = Console(config, pool, Sessions(config.web.auth, session_key), templates())
    routes = [
        Route("/", pages.overview(console)),
        Route("/tasks", pages.task_list(console)),
        Route("/tasks/{task_id:path}", pages.task_page(console)),
        Route("/schedules", pages.schedules(console)),
        Route("/limits", pages.limits(console)),
        Route("/pauses", pages.pauses(console)),
        Route("/daemons", pages.daemons(console)),
        Route("/login", pages.login(console)),
        Route("/login", actions.login(console), methods=["POST"]),
        Route("/logout", actions.logout(console), methods=["POST"]),
        Route("/actions/{action}", actions.act(console), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(ServerTiming)], exception_handlers={
        Refused: _refused(console), UsageError: _bad_input(console),
        TaskNotFound: _not_found(console), OperationalError: _unavailable(console),
        Exception: _failed(console), 404: _no_route(console), 405: _no_route(console)})
    app.state.console = console
    return app


# Every answer: no page of another site may frame the console or run a script in it.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; "
                                 b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


class ServerTiming:
    """ASGI middleware: each answer says how long the server took to start it
    (``Server-Timing: app;dur=<ms>``, what ``pgtaskd web-bench`` reads), and carries the
    security headers."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed(message):
            if message["type"] == "http.response.start":
                spent = (time.perf_counter() - start) * 1000
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS,
                                      (b"server-timing", f"app;dur={spent:.2f}".encode())]
            await send(message)

        await self.app(scope, receive, timed)


def error_page(console: Console, request: Request, status: int, message: str) -> Response:
    return console.page(request, "error.html", status=status, status_code=status,
                        message=message)


def _refused(console):
    async def handle(request, exc):
        return error_page(console, request, exc.status, str(exc))
    return handle


def _bad_input(console):
    async def handle(request, exc):
        return error_page(console, request, 400, str(exc))
    return handle


def _not_found(console):
    async def handle(request, exc):
        return error_page(console, request, 404, str(exc))
    return handle


def _unavailable(console):
    async def handle(request, exc):
        return error_page(console, request, 503, str(exc))
    return handle


def _no_route(console):
    async def handle(request, exc):
        status = getattr(exc, "status_code", 404)
        message = "no such page" if status == 404 else "method not allowed here"
        return error_page(console, request, status, message)
    return handle


_last_failure = [0.0]


def _failed(console):
    async def handle(request, exc):
        # One line a minute at most: a fault hit by every live update must not flood.
        if time.monotonic() - _last_failure[0] > 60:
            _last_failure[0] = time.monotonic()
            emit("web_error", logging.ERROR, path=request.url.path,
                 error=one_line(exc, typed=True))
        return error_page(console, request, 500, "the console failed on this page")
    return handle
