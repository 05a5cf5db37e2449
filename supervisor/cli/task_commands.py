"""The task commands: ``submit``, ``cancel``, ``retry``, ``show``, ``list`` and ``stats``
(``cancel`` and ``retry`` by filter: bulk_commands).

Each runs once its arguments are parsed and its config loaded, through the client on the
configured database.
"""

from __future__ import annotations

import sys
from datetime import datetime

from ..client import STATUSES, Client, TaskNotFound, TaskStateError
from ..config import Config
from ..db.loaders import StoredJson
from ..db.queue_figures import COUNT_CAP
from ..errors import EXIT_FAILURE, EXIT_OK, quote
from .bulk_commands import check_ids_alone, run_filtered
from .operator_input import arguments_named, read_payload
from .output import OutputLost, human_time, print_json, printable, render_table, shown


class _Refused(Exception):
    """Leaves a ``client.transaction()`` block so that it rolls back, with nothing to report."""


def cmd_submit(args, config: Config) -> int:
    payload = read_payload(args.payload, args.payload_file, config.max_payload_bytes)
    with Client.from_config(config) as client:
        with arguments_named():
            task_id = client.submit(args.task_type, payload, priority=args.priority,
                                    run_at=args.at, delay=args.delay, task_id=args.id,
                                    name=args.name, max_retries=args.max_retries,
                                    unique_key=args.unique_key)
        status = "PENDING"
        if not task_id.created:
            existing = client.get(task_id)
            status = existing["status"] if existing else "unknown"
    try:
        if args.json:
            print_json({"id": task_id, "created": task_id.created, "status": status})
        else:
            print(task_id)
        sys.stdout.flush()
    except OSError as exc:
        if not task_id.created:
            raise
        # A script that retries on failure would enqueue the task twice without --id.
        again = "do not submit it again without --id" if args.id is None \
            else "submitting it again with the same --id creates nothing"
        raise OutputLost(f"task {printable(task_id)} was submitted, but its id could not be "
                         f"written ({exc.strerror or exc}); {again}") from exc
    if not task_id.created and args.unique_key is not None and task_id != args.id:
        print(f"note: task {printable(task_id)} holds unique key {quote(args.unique_key)} "
              f"({status}); nothing submitted", file=sys.stderr)
    elif not task_id.created:
        print(f"note: task {printable(task_id)} exists already ({status}); nothing submitted",
              file=sys.stderr)
    elif config.handled_types and args.task_type not in config.handled_types:
        # Only a config that names handlers can say a type is unknown; a submit-only config
        # names none. Another daemon, with its own config, may still run this type.
        where = config.path or "the config"
        print(f"warning: no handler for task type {quote(args.task_type)} in {where}; "
              f"it waits until a daemon that handles it runs", file=sys.stderr)
    return EXIT_OK


def cmd_cancel(args, config: Config) -> int:
    if not args.ids:
        return run_filtered(args, config, "cancel")
    check_ids_alone(args, "cancel")
    return _change_all(args, config, Client.cancel, "cancelled", "CANCELLED")


def cmd_retry(args, config: Config) -> int:
    if not args.ids:
        return run_filtered(args, config, "retry")
    check_ids_alone(args, "retry")
    return _change_all(args, config, Client.retry, "retried", "PENDING")


def _change_all(args, config: Config, change, done: str, new_status: str) -> int:
    """Apply ``change`` to every id in one transaction: all of them, or none."""
    task_ids = list(dict.fromkeys(args.ids))
    problems = []
    with Client.from_config(config) as client:
        try:
            with client.transaction():
                for task_id in task_ids:
                    try:
                        change(client, task_id)
                    except (TaskNotFound, TaskStateError) as exc:
                        problems.append(str(exc))
                if problems:
                    raise _Refused
        except _Refused:
            pass
    if problems:
        suffix = f"; none of the {len(task_ids)} tasks was {done}" if len(task_ids) > 1 else ""
        for problem in problems:
            print(f"error: {printable(problem)}{suffix}", file=sys.stderr)
        return EXIT_FAILURE
    if args.json:
        print_json([{"id": task_id, "status": new_status} for task_id in task_ids])
    else:
        for task_id in task_ids:
            print(f"{done} {printable(task_id)}")
    return EXIT_OK


def cmd_show(args, config: Config) -> int:
    with Client.from_config(config) as client:
        task = client.get(args.id)
        if task is None:
            raise TaskNotFound(args.id)
        failures = client.failed_attempts(args.id, limit=None if args.attempts else 1)
    if args.json:
        shown_task = {**task, "last_failure": failures[-1] if failures else None}
        if args.attempts:
            shown_task["failed_attempts"] = failures
        print_json(shown_task)
        return EXIT_OK
    if isinstance(task["payload"], StoredJson):
        print(f"note: task {printable(task['id'])}: the payload is shown as PostgreSQL stores "
              f"it, as Python cannot read it ({task['payload'].reason})", file=sys.stderr)
    width = max(len(column) for column in task) + 2
    # The payload may run over many lines: last, so that it does not split the fields.
    columns = [c for c in task if c != "payload"] + ["payload"]
    for column in columns:
        lines = [printable(line) for line in shown(column, task[column]).splitlines() or [""]]
        print(column.ljust(width) + ("\n" + " " * width).join(lines))
    if args.attempts:
        print(f"\nfailed attempts: {len(failures) or 'none'}"
              + (" (the last ones kept, oldest first)" if failures else ""))
    elif failures:
        print("\nlast failed attempt (all of them: --attempts)")
    for failure in failures:
        print()
        print_failure(failure)
    return EXIT_OK


def print_failure(failure: dict) -> None:
    """One failed attempt: a line that says which run ended how, when and where, then its
    traceback (or, with none, its message)."""
    outcome = failure["outcome"] + (f" ({failure['signal']})" if failure["signal"] else "")
    took = ""
    started, ended = failure["started_at"], failure["ended_at"]
    if isinstance(started, datetime) and isinstance(ended, datetime):
        took = f" after {max((ended - started).total_seconds(), 0.0):.3f} s"
    print(printable(f"run {shown('attempt', failure['attempt'])}: {outcome} at "
                    f"{human_time(ended)}{took}, worker {shown('worker', failure['worker_id'])}"))
    body = failure["traceback"] or ": ".join(
        part for part in (failure["error_type"], failure["message"]) if part)
    for line in body.rstrip("\n").splitlines():
        print("  " + printable(line))


def cmd_list(args, config: Config) -> int:
    with Client.from_config(config) as client:
        tasks = client.list(status=args.status, task_type=args.type, limit=args.limit)
    if args.json:
        print_json(tasks)
    elif not tasks:
        print("(no tasks)")
    else:
        print(render_table(
            ["ID", "TYPE", "STATUS", "PRIORITY", "RETRIES", "SCHEDULED", "UPDATED"],
            [[t["id"], t["task_type"], t["status"], str(t["priority"]),
              f"{t['retry_count']}/{t['max_retries']}", human_time(t["scheduled_time"]),
              human_time(t["updated_at"])] for t in tasks],
            right_aligned={"PRIORITY", "RETRIES"}))
    return EXIT_OK


def shown_figure(value: int, kind: str | None) -> str:
    """A count as stats prints it: "about N" for an estimate, "more than N" for a count that
    stopped past N (its figure is N + 1)."""
    if kind == "estimate":
        return f"about {value}"
    if kind == "at_least":
        return f"more than {value - 1}"
    return str(value)


def cmd_stats(args, config: Config) -> int:
    with Client.from_config(config) as client:
        stats = client.stats()
    if args.json:
        print_json(stats)
        return EXIT_OK
    not_exact = stats["not_exact"]
    counts = ", ".join(
        f"{status} {shown_figure(stats['by_status'][status], not_exact.get('by_status.' + status))}"
        for status in STATUSES)
    print(f"tasks: {shown_figure(stats['total'], not_exact.get('total'))} ({counts})")
    age = stats["oldest_pending_age"]
    waiting = f", the oldest waiting {age:.1f} s" if age is not None else ""
    print(f"due pending: {shown_figure(stats['due_pending'], not_exact.get('due_pending'))}"
          f"{waiting}")
    print(f"expired leases: "
          f"{shown_figure(stats['expired_leases'], not_exact.get('expired_leases'))}")
    for pause in stats["paused_types"]:
        due = pause["due_pending"]
        shown = shown_figure(due, "at_least" if pause["due_pending_at_least"] else None)
        print(f"paused: {printable(pause['task_type'])} since {human_time(pause['paused_at'])} "
              f"by {printable(pause['paused_by'] or '?')} "
              f"({shown} due task{'' if due == 1 else 's'} waiting)")
    for limit in stats["limits"]:
        print(f"limited: {printable(limit['task_type'])} to {limit['max_running']} at once "
              f"({limit['running']} running)")
    if stats["by_type"]:
        print()
        if "by_type" in not_exact:
            print(f"by type: estimated from a sample of the table (RUNNING, and PENDING up "
                  f"to {COUNT_CAP}, counted)")
        print(render_table(
            ["TYPE", *STATUSES, "TOTAL"],
            [[task_type, *(str(by_status[s]) for s in STATUSES), str(sum(by_status.values()))]
             for task_type, by_status in stats["by_type"].items()],
            right_aligned={*STATUSES, "TOTAL"}))
    if not_exact:
        print()
        print("about: the statistics' or a sample's estimate; more than N: counting stopped")
    return EXIT_OK
