"""The bulk commands: ``retry``, ``cancel`` and ``purge`` by filter, through the client's
``retry_matching``, ``cancel_matching`` and ``purge_matching``.

``retry`` and ``cancel`` take ids (task_commands) or a filter (here), never both.
"""

from __future__ import annotations

from ..client import DEFAULT_BULK_BATCH, BulkOutcome, Client, TaskFilter
from ..config import Config
from ..errors import EXIT_OK, UsageError
from .operator_input import arguments_named
from .output import print_json

# The filter's options, by the TaskFilter field each one sets.
FILTER_OPTIONS = {"types": "task_types", "statuses": "statuses", "since": "since",
                  "before": "before", "error": "error", "id_prefix": "id_prefix",
                  "name_prefix": "name_prefix", "unique_key": "unique_key"}
# Options that only a filter takes.
WALK_OPTIONS = {"dry_run": "--dry-run", "max_tasks": "--max", "batch_size": "--batch-size"}
DONE = {"retry": "retried", "cancel": "cancelled", "purge": "deleted"}
VERB = {"retry": "retry", "cancel": "cancel", "purge": "delete"}


def has_filter(args) -> bool:
    return any(getattr(args, option) is not None for option in FILTER_OPTIONS)


def check_ids_alone(args, action: str) -> None:
    """``retry ID...`` / ``cancel ID...``: ids and a filter together are refused."""
    if has_filter(args):
        raise UsageError(f"pgtaskd {action}: give task ids or a filter (--type, --status, "
                         f"...), not both")
    for option, name in WALK_OPTIONS.items():
        if getattr(args, option) not in (None, False):
            raise UsageError(f"{name}: applies to a filter, not to task ids")


def cmd_purge(args, config: Config) -> int:
    return run_filtered(args, config, "purge")


def run_filtered(args, config: Config, action: str) -> int:
    if not has_filter(args):
        what = "a filter" if action == "purge" else "task ids, or a filter"
        older = " --older-than," if action == "purge" else ""
        raise UsageError(f"pgtaskd {action}: give {what} (--type, --status, --since, --before,"
                         f"{older} --error, --id-prefix, --name-prefix or --unique-key)")
    with arguments_named():
        where = TaskFilter(**{field: getattr(args, option)
                              for option, field in FILTER_OPTIONS.items()
                              if getattr(args, option) is not None})
    batch_size = DEFAULT_BULK_BATCH if args.batch_size is None else args.batch_size
    with Client.from_config(config) as client:
        act = {"retry": client.retry_matching, "cancel": client.cancel_matching,
               "purge": client.purge_matching}[action]
        with arguments_named():
            outcome = act(where, dry_run=args.dry_run, batch_size=batch_size,
                          max_tasks=args.max_tasks)
    if args.json:
        print_json(outcome.as_dict())
    else:
        print(summary(outcome, args.max_tasks))
    return EXIT_OK


def summary(outcome: BulkOutcome, max_tasks: int | None) -> str:
    """One line: what the action did, or would do."""
    action = outcome.action
    if outcome.dry_run:
        count = outcome.matched - outcome.refused
        line = f"would {VERB[action]} {'more than ' if outcome.at_least else ''}" \
               f"{_tasks(count - 1 if outcome.at_least else count)}"
        if action == "retry":
            line += f", refuse {outcome.refused} (a live task holds the unique key)"
        if outcome.at_least:
            line += "; counting stopped there (--max N counts up to N)"
    else:
        line = f"{DONE[action]} {_tasks(outcome.changed)}"
        if action == "retry":
            line += f", refused {outcome.refused} (a live task holds the unique key)"
        line += (f", skipped {outcome.skipped} (changed or locked by another session "
                 f"meanwhile)")
    if outcome.reached_max:
        line += f"; stopped at --max {max_tasks}"
    return line


def _tasks(count: int) -> str:
    return f"{count} task{'' if count == 1 else 's'}"
