"""Bulk retry, cancel and purge of the console's task list: every task its filters match,
through the client's ``retry_matching``, ``cancel_matching`` and ``purge_matching``, at most
BULK_MAX_TASKS a click. Purge takes finished tasks only: a filter naming PENDING or RUNNING
is the client's refusal, a 400 with its reason.

It takes two POSTs. The list's form posts its filters; that first POST is a dry run, whose
page shows how many tasks would change and a confirmation form carrying the same filters
and ``confirm``; only that second POST acts. The confirmation acts on what matches when it
arrives (the client fixes the window as it starts): the count is what matched a moment
before, and the result page says what was done.
"""

from __future__ import annotations

import dataclasses
import logging
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from ..client import BulkOutcome, Client, ListFilter, TaskFilter
from ..errors import UsageError
from ..logs import emit
from .app import Console
from .pages import LIST_FIELDS, list_filter

# A click retries, cancels or purges at most this many tasks: at a few thousand a second in
# batches of 1,000, its answer comes well within the connection's deadline. More are
# taken by clicking again (or by `pgtaskd retry` / `cancel` / `purge`).
BULK_MAX_TASKS = 10_000
# Each field of the list's filter, and the bulk filter's field that means the same (a
# status and a type become one-element lists). A list filter that has none here is refused:
# left out, the action would take more tasks than the list shows.
TASK_FILTER_FIELDS = {"status": "statuses", "task_type": "task_types",
                      "id_prefix": "id_prefix", "name_prefix": "name_prefix",
                      "unique_key": "unique_key", "error": "error"}
# The client's action behind each console action.
BULK_ACTIONS = {"bulk-retry": "retry", "bulk-cancel": "cancel", "bulk-purge": "purge"}
# The form's keys beside the list's filters.
FORM_KEYS = {"csrf", "confirm"}
# A filter's text in a log line, at most (a form may hold 16 KiB).
LOGGED_TEXT = 200


def task_filter(shown: ListFilter) -> TaskFilter:
    """The bulk filter that takes exactly the tasks the list shows, or UsageError."""
    given = {}
    for field in dataclasses.fields(ListFilter):
        value = getattr(shown, field.name)
        if value is None:
            continue
        target = TASK_FILTER_FIELDS.get(field.name)
        if target is None:
            raise UsageError(f"{field.name}: a bulk action cannot filter by it; clear it "
                             f"from the list's filters, or act on the tasks one by one")
        given[target] = (value,) if target in ("statuses", "task_types") else value
    return TaskFilter(**given)


def run(client: Client, action: str, form: dict[str, str]) -> BulkOutcome:
    """A dry run of the action on the form's filters, or (with ``confirm``) the action."""
    where = task_filter(list_filter(form, also=FORM_KEYS))
    walk = {"retry": client.retry_matching, "cancel": client.cancel_matching,
            "purge": client.purge_matching}[BULK_ACTIONS[action]]
    return walk(where, dry_run=form.get("confirm") != "yes", max_tasks=BULK_MAX_TASKS)


def logged_filter(form: dict[str, str]) -> dict[str, str]:
    """The list's filters as the form gave them, for the action's log line."""
    return {key: form[key][:LOGGED_TEXT] for key in LIST_FIELDS if form.get(key)}


def answer(console: Console, request: Request, action: str, form: dict[str, str],
           outcome: BulkOutcome, user: str) -> Response:
    """The page of a dry run (the count, and the confirmation) or of the action done."""
    shown = {key: form.get(key, "") for key in LIST_FIELDS}
    if not outcome.dry_run:
        emit("web_action", logging.INFO, user=user, action=action, outcome="done",
             filter=logged_filter(form), changed=outcome.changed, refused=outcome.refused,
             skipped=outcome.skipped, reached_max=outcome.reached_max)
    return console.page(request, "bulk.html", action=action, verb=BULK_ACTIONS[action],
                        outcome=outcome, filters={k: v for k, v in shown.items() if v},
                        max_tasks=BULK_MAX_TASKS,
                        back="/tasks?" + urlencode([(k, v) for k, v in shown.items() if v]))
