"""The console's pages (GET): overview, tasks, a task, schedules, limits, pauses, login.

Each reads through the client and renders a template whose ``live`` block is what the
page's script fetches again every ``web.refresh_interval``.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlencode

from starlette.requests import Request

from ..client import STATUSES, ListFilter, TaskNotFound
from ..db.loaders import StoredJson
from ..errors import UsageError
from . import charts
from .app import Console

_SCHEDULE_ID = re.compile(r"^schedule:(.+):(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)$", re.DOTALL)
# Query keys of the task list: the filter's fields, as the form names them.
LIST_FIELDS = {"status": "status", "type": "task_type", "id": "id_prefix",
               "name": "name_prefix", "key": "unique_key", "error": "error"}


def overview(console: Console):
    async def endpoint(request: Request):
        known = console.config.handled_types

        def read(client):
            return client.overview(known), client.activity()

        types, minutes = await console.read(read)
        totals = {
            "due": sum(t["due"] for t in types),
            "due_at_least": any(t["due_at_least"] for t in types),
            "later": sum(t["later"] for t in types),
            "later_at_least": any(t["later_at_least"] for t in types),
            "running": sum(t["running"] for t in types),
            "failed_24h": sum(t["failed_24h"] for t in types),
            "completed_1h": sum(t["completed_1h"] for t in types),
        }
        return console.page(request, "overview.html", types=types, totals=totals,
                            activity=charts.activity_chart(minutes),
                            depth=charts.depth_chart(minutes),
                            rolled_up=any(m["completed"] is not None for m in minutes))
    return endpoint


def task_list(console: Console):
    async def endpoint(request: Request):
        query = request.query_params
        filters = list_filter(query, also={"after", "notice"})
        after = query.get("after") or None
        page = await console.read(lambda client: client.browse(filters, after=after))
        shown = {key: query.get(key, "") for key in LIST_FIELDS}
        shown["status"] = filters.status
        return console.page(request, "tasks.html", page=page, filters=shown,
                            statuses=STATUSES, first=after is None,
                            next_query=_query(shown, page.after) if page.after else None,
                            first_query=_query(shown, None))
    return endpoint


def list_filter(values, *, also: set[str]) -> ListFilter:
    """The task list's filter from a query string or a form (whose other keys are ``also``),
    or UsageError naming the key."""
    unknown = sorted(set(values) - set(LIST_FIELDS) - also)
    if unknown:
        raise UsageError(f"{unknown[0]}: not a filter of this list (filters: "
                         f"{', '.join(LIST_FIELDS)})")
    given = {field: values.get(key) for key, field in LIST_FIELDS.items() if key in values}
    return ListFilter.checked(**given)


def _query(shown: dict, after: str | None) -> str:
    pairs = [(key, value) for key, value in shown.items() if value]
    if after:
        pairs.append(("after", after))
    return urlencode(pairs)


def task_page(console: Console):
    async def endpoint(request: Request):
        task_id = request.path_params["task_id"]

        def read(client):
            task = client.inspect(task_id)
            return task, client.failed_attempts(task_id) if task is not None else []

        task, attempts = await console.read(read)
        if task is None:
            raise TaskNotFound(task_id)
        payload = task["payload"]
        if isinstance(payload, StoredJson):
            shown_payload = str(payload)
        else:
            shown_payload = json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True)
        lease_left = task.pop("lease_left")
        database_now = task.pop("database_now")
        return console.page(request, "task.html", task=task, payload=shown_payload,
                            attempts=attempts,
                            lease_left=lease_left, database_now=database_now,
                            schedule=_schedule_of(console, task["id"]),
                            columns=[c for c in task if c not in ("payload", "error_message")])
    return endpoint


def _schedule_of(console: Console, task_id: str) -> dict | None:
    match = _SCHEDULE_ID.match(task_id)
    if not match:
        return None
    name, instant = match[1], match[2]
    configured = next((s for s in console.config.schedules if s.name == name), None)
    return {"name": name, "instant": instant, "config": configured}


def schedules(console: Console):
    async def endpoint(request: Request):
        found = console.config.schedules
        rows = await console.read(lambda client: client.schedule_status(found)) if found else []
        return console.page(request, "schedules.html", schedules=rows,
                            config_path=str(console.config.path or "the built-in config"))
    return endpoint


def limits(console: Console):
    async def endpoint(request: Request):
        rows = await console.read(lambda client: client.limits())
        return console.page(request, "limits.html", limits=rows)
    return endpoint


def pauses(console: Console):
    async def endpoint(request: Request):
        rows = await console.read(lambda client: client.paused())
        return console.page(request, "pauses.html", pauses=rows)
    return endpoint


def login(console: Console):
    async def endpoint(request: Request):
        return console.page(request, "login.html", failed=False,
                            next=request.query_params.get("next", "/"))
    return endpoint


def daemons(console: Console):
    """The daemon registry: every daemon on this database, its children and what each runs."""
    async def endpoint(request: Request):
        rows = await console.read(lambda client: client.daemons())
        return console.page(request, "daemons.html", daemons=rows)
    return endpoint
