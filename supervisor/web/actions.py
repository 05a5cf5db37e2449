"""The console's actions (POST): log in and out, and act on the queue.

An action is taken only with ``web.actions: true``, by an authenticated user, with the
session's CSRF token in its form; anything else is a 403 and changes nothing. Each calls
the client's own function (retry, cancel, pause, resume, set_limit, remove_limit, and
retry_matching, cancel_matching and purge_matching for the list's bulk actions: no SQL of
its own) and is logged as one JSON line with its user, whether it was done or refused.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import parse_qs, quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..client import BulkOutcome, Client, TaskNotFound, TaskStateError
from ..errors import OperationalError, UsageError, one_line
from ..logs import emit
from . import bulk
from .app import Console, Refused, error_page
from .passwords import check_password
from .sessions import Session, same_token

MAX_FORM_BYTES = 16 * 1024
MAX_FORM_FIELDS = 20
# Password checks at once: each takes scrypt's 16 MiB and about 100 ms of a core.
LOGIN_CHECKS = asyncio.Semaphore(2)


async def read_form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST, at most MAX_FORM_BYTES (413 past it)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
        raise Refused(413, f"a form is at most {MAX_FORM_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused(413, f"a form is at most {MAX_FORM_BYTES} bytes")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                          max_num_fields=MAX_FORM_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise Refused(400, "the form could not be read") from None
    return {key: values[0] for key, values in fields.items()}


def _checked_form(console: Console, request: Request, form: dict, session: Session) -> None:
    if not same_token(form.get("csrf"), session):
        raise Refused(403, "the form's token is not this session's (reload the page and "
                           "try again)")


def _back(form: dict, default: str) -> str:
    """Where to go after an action: a path of this site, never another site's address."""
    target = form.get("next") or default
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    return target


def _with_notice(target: str, notice: str) -> str:
    return f"{target}{'&' if '?' in target else '?'}notice={notice}"


def login(console: Console):
    async def endpoint(request: Request) -> Response:
        session = console.session(request)
        form = await read_form(request)
        _checked_form(console, request, form, session)
        user, password = form.get("user", ""), form.get("password", "")
        stored = console.config.web.auth.users.get(user)
        async with LOGIN_CHECKS:
            # A user who does not exist costs a check too, so the time tells nothing.
            ok = await asyncio.to_thread(check_password, password,
                                         stored or _DUMMY_HASH) and stored is not None
        client = request.client.host if request.client else None
        emit("web_login", logging.INFO if ok else logging.WARNING, user=user[:100],
             outcome="ok" if ok else "refused", client=client)
        if not ok:
            return console.page(request, "login.html", status=401, failed=True,
                                next=_back(form, "/"))
        response = RedirectResponse(_back(form, "/"), status_code=303)
        console.remember(response, console.sessions.new(user))
        return response
    return endpoint


def logout(console: Console):
    async def endpoint(request: Request) -> Response:
        session = console.session(request)
        form = await read_form(request)
        _checked_form(console, request, form, session)
        emit("web_logout", user=session.user)
        response = RedirectResponse("/?notice=logged-out", status_code=303)
        console.remember(response, console.sessions.new(None))
        return response
    return endpoint


# The client's function behind each action, with the form fields it takes and the notice
# it leaves. A bulk action answers with a page of its own instead (a dry run's count and
# its confirmation, or what it did): see bulk.py.
ACTIONS = {
    "bulk-retry": (("status",), lambda c, f: bulk.run(c, "bulk-retry", f), None),
    "bulk-cancel": (("status",), lambda c, f: bulk.run(c, "bulk-cancel", f), None),
    "bulk-purge": (("status",), lambda c, f: bulk.run(c, "bulk-purge", f), None),
    "retry": (("task_id",), lambda c, f: c.retry(f["task_id"]), "retried"),
    "cancel": (("task_id",), lambda c, f: c.cancel(f["task_id"]), "cancelled"),
    "pause": (("task_type",), None, "paused"),
    "resume": (("task_type",), lambda c, f: c.resume(f["task_type"]), "resumed"),
    "set-limit": (("task_type", "max_running"), None, "limit-set"),
    "remove-limit": (("task_type",), lambda c, f: c.remove_limit(f["task_type"]),
                     "limit-removed"),
}


def _run(action: str, client: Client, form: dict, user: str):
    if action == "pause":
        return client.pause(form["task_type"], paused_by=f"{user} (web)")
    if action == "set-limit":
        text = form["max_running"].strip()
        if not text.isdigit() or len(text) > 9:
            raise UsageError("max_running: must be a whole number of tasks")
        return client.set_limit(form["task_type"], int(text), set_by=f"{user} (web)")
    return ACTIONS[action][1](client, form)


def act(console: Console):
    async def endpoint(request: Request) -> Response:
        action = request.path_params["action"]
        session = console.session(request)
        if action not in ACTIONS:
            raise Refused(404, f"no action {action!r}")
        form = await read_form(request)
        if not console.config.web.actions:
            raise Refused(403, "actions are off (web.actions: false): this console only "
                               "shows")
        if session.user is None:
            raise Refused(403, "log in to act")
        _checked_form(console, request, form, session)
        fields, _, notice = ACTIONS[action]
        missing = [name for name in fields if not form.get(name)]
        if missing:
            raise UsageError(f"{missing[0]}: missing from the form")
        target = ({"filter": bulk.logged_filter(form)} if action in bulk.BULK_ACTIONS
                  else {name: form[name] for name in fields})
        try:
            done = await console.read(lambda client: _run(action, client, form, session.user))
        except (TaskNotFound, TaskStateError, UsageError, OperationalError) as exc:
            emit("web_action", logging.WARNING, user=session.user, action=action,
                 outcome="refused", error=one_line(exc), **target)
            status = {TaskNotFound: 404, TaskStateError: 409, UsageError: 400}.get(
                type(exc), 503)
            return error_page(console, request, status, str(exc))
        if isinstance(done, BulkOutcome):
            return bulk.answer(console, request, action, form, done, session.user)
        emit("web_action", user=session.user, action=action, outcome="done", **target)
        default = (f"/tasks/{quote(form['task_id'], safe='')}" if "task_id" in fields
                   else "/limits" if "limit" in action else "/pauses")
        return RedirectResponse(_with_notice(_back(form, default), notice), status_code=303)
    return endpoint


# Checked when the user is unknown, so that a wrong name costs what a wrong password does.
_DUMMY_HASH = ("scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA==$"
               "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=")
