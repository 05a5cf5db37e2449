"""The commands that steer every daemon on the database: ``pause``, ``resume``, ``limit``,
``limits``, and ``schedules``, which lists the config's periodic tasks and their runs.

Pauses and limits are kept in the database, so they hold fleet-wide and outlive restarts.
"""

from __future__ import annotations

import sys

from ..client import Client
from ..config import Config
from ..errors import EXIT_OK, quote
from .operator_input import arguments_named
from .output import human_time, print_json, printable, render_table


def cmd_pause(args, config: Config) -> int:
    task_types = list(dict.fromkeys(args.task_types))
    with Client.from_config(config) as client:
        with client.transaction():
            with arguments_named():
                changed = {task_type: client.pause(task_type) for task_type in task_types}
        pauses = {p["task_type"]: p for p in client.paused()}
    unknown = [t for t in task_types if config.handled_types and t not in config.handled_types]
    if args.json:
        print_json([{"task_type": t, "paused": True, "changed": changed[t],
                     "paused_at": pauses.get(t, {}).get("paused_at"),
                     "paused_by": pauses.get(t, {}).get("paused_by")} for t in task_types])
    else:
        for task_type in task_types:
            print(f"paused {printable(task_type)}")
    for task_type in task_types:
        pause = pauses.get(task_type)
        if not changed[task_type] and pause is not None:
            print(f"note: {quote(task_type)} was paused already, since "
                  f"{human_time(pause['paused_at'])} by {printable(pause['paused_by'] or '?')}",
                  file=sys.stderr)
    if unknown:
        # As for submit: a daemon with another config may run it, so this is no error; but a
        # misspelt type stops nothing an operator meant to stop.
        print(f"warning: no handler for task type {', '.join(quote(t) for t in unknown)} "
              f"in {config.path or 'the config'}", file=sys.stderr)
    return EXIT_OK


def cmd_resume(args, config: Config) -> int:
    task_types = list(dict.fromkeys(args.task_types))
    with Client.from_config(config) as client:
        with client.transaction():
            with arguments_named():
                changed = {task_type: client.resume(task_type) for task_type in task_types}
    if args.json:
        print_json([{"task_type": t, "paused": False, "changed": changed[t]}
                    for t in task_types])
    else:
        for task_type in task_types:
            print(f"resumed {printable(task_type)}")
    for task_type in task_types:
        if not changed[task_type]:
            print(f"note: {quote(task_type)} was not paused", file=sys.stderr)
    return EXIT_OK


def cmd_limit(args, config: Config) -> int:
    with Client.from_config(config) as client, arguments_named():
        if args.max_running is None:
            changed = client.remove_limit(args.task_type)
            result = {"task_type": args.task_type, "max_running": None, "changed": changed}
        else:
            row = client.set_limit(args.task_type, args.max_running)
            result = {"task_type": args.task_type, "max_running": row["max_running"],
                      "previous": row["previous"], "changed": row["changed"]}
    if args.json:
        print_json(result)
    elif args.max_running is None:
        print(f"{printable(args.task_type)}: no limit")
    else:
        print(f"{printable(args.task_type)}: at most {args.max_running} running")
    if not result["changed"]:
        print(f"note: {quote(args.task_type)} "
              f"{'had no limit' if args.max_running is None else 'had that limit already'}",
              file=sys.stderr)
    elif result.get("previous") is not None:
        print(f"note: the limit was {result['previous']}", file=sys.stderr)
    if args.task_type in config.limits and config.limits[args.task_type] != args.max_running:
        print(f"warning: {config.path or 'the config'} sets limits.{args.task_type}: "
              f"{config.limits[args.task_type]}; daemons write it again at their next start "
              f"or reload", file=sys.stderr)
    return EXIT_OK


def cmd_limits(args, config: Config) -> int:
    with Client.from_config(config) as client:
        limits = client.limits()
    if args.json:
        print_json(limits)
    elif not limits:
        print("(no limits)")
    else:
        print(render_table(
            ["TYPE", "LIMIT", "RUNNING", "SET", "BY"],
            [[l["task_type"], str(l["max_running"]), str(l["running"]), human_time(l["updated_at"]),
              l["updated_by"] or "-"] for l in limits], right_aligned={"LIMIT", "RUNNING"}))
    return EXIT_OK


def cmd_schedules(args, config: Config) -> int:
    with Client.from_config(config) as client:
        schedules = client.schedule_status()
    if args.json:
        print_json(schedules)
    elif not schedules:
        print(f"(no schedules in {config.path or 'the config'})")
    else:
        print(render_table(
            ["NAME", "CRON", "TIMEZONE", "TYPE", "NEXT RUN", "LAST RUN", "LAST STATUS"],
            [[s["name"], s["cron"], s["timezone"], s["task_type"], human_time(s["next_run"]),
              human_time(s["last_run"]),
              (s["last_status"] or "-") if s["last_run"] else "-"] for s in schedules]))
        for s in schedules:
            if s["conflict"]:
                print(conflict_line(s))
            if s["clock"]:
                print(clock_line(s))
    return EXIT_OK


def clock_line(schedule: dict) -> str:
    """Under the table, one line per schedule enqueued through an instant the database's
    clock has not reached."""
    said = (f"enqueued through {human_time(schedule['through'])}, ahead of the database "
            f"clock ({human_time(schedule['database_now'])})")
    if schedule["clock"] == "waits":
        said += ": it enqueues nothing until the clock passes that instant"
    else:
        said += (": too far ahead to wait for, the next pass starts it again at the clock "
                 "(the row is taken as corrupt)")
    return f"clock: schedule {schedule['name']}: {said}"


def conflict_line(schedule: dict) -> str:
    """Under the table, one line per schedule whose daemons disagree on its definition."""
    name, recorded = schedule["name"], schedule["recorded_definition"]
    others = schedule["disagreeing"]
    if recorded != schedule["definition"]:
        said = (f"this config's definition ({schedule['definition'][:12]}) is not the one in "
                f"force ({recorded[:12]}): a daemon running this config enqueues nothing for it")
    else:
        said = "this config's definition is the one in force"
    if others:
        said += f"; daemons with another definition: {', '.join(others)}"
    return f"conflict: schedule {name}: {said}"
