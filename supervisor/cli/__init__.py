"""The ``pgtaskd`` command line.

Every command but ``completion`` takes ``-c/--config`` (or ``$PGTASKD_CONFIG``); all but
``run``, ``worker``, ``web`` and ``completion`` take ``--json`` for scripts. Errors are one
line on stderr and an exit code: 2 for bad input (arguments, config, payload), 1 for
operational failures (database unreachable, task missing, a task in the wrong status). No
traceback reaches an operator.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
import textwrap

import psycopg

from .. import __version__
from ..config import MAX_LIMIT, load_config
from ..errors import EXIT_FAILURE, EXIT_USAGE, ConfigError, OperationalError, UsageError
from .completion import add_completion_command
from .output import OutputLost
from .argument_types import (limit_value, non_negative_int, parse_age, parse_duration,
                             parse_timestamp, parse_when, positive_int, positive_int_list,
                             work_milliseconds)

EPILOG = textwrap.dedent("""\
    examples:
      pgtaskd run -c etc/pgtaskd.yaml                    run the daemon
      pgtaskd migrate -c etc/pgtaskd.yaml                create or upgrade the schema
      pgtaskd check-config -c etc/pgtaskd.yaml           validate the config and the handlers
      pgtaskd submit echo --payload '{"text": "hi"}'     enqueue a task, print its id
      pgtaskd list --status FAILED                       the failed tasks, newest first
      pgtaskd show 0b9c4f0e-2d4e-4d6a-9a51-3f1c2d7e8a10  every field of one task
      pgtaskd cancel ID...                               cancel pending or running tasks
      pgtaskd retry ID...                                run failed or cancelled tasks again
      pgtaskd retry --type T --since 1h --dry-run        ... or every task a filter matches
      pgtaskd purge --type T --older-than 7d             delete finished tasks by filter
      pgtaskd stats --json                               queue counts, for scripts
      pgtaskd pause TYPE... / pgtaskd resume TYPE...     stop / restart claims of a type
      pgtaskd schedules                                  periodic tasks: next and last runs
      pgtaskd limit TYPE N / pgtaskd limits              global concurrency limits
      pgtaskd daemons                                    the daemons, their children, their tasks
      pgtaskd web -c etc/pgtaskd.yaml                    the web console (the web extra)
      pgtaskd completion bash                            print the bash completion script

    Every command but completion takes -c FILE (default: $PGTASKD_CONFIG); all but run,
    worker, web and completion take --json. The database is $PGTASKD_DSN if set, else
    database.dsn from the config, else the embedded PostgreSQL.
    Exit status: 0 done, 1 operational failure (database unreachable, no such task, a
    task in the wrong status), 2 bad input (arguments, config, payload).
    """)

# What supervisor/daemon/arbiter.py does with each signal it handles (SIGNAL_NAMES there).
RUN_SIGNALS = textwrap.dedent("""\
    signals:
      SIGTERM, SIGINT   stop: no new claims, running tasks finish (shutdown_timeout), exit 0
      SIGQUIT           stop at once: children killed, their tasks released to PENDING
      SIGHUP            reload the config and the handlers' code; a bad config is logged and
                        the running one kept
      SIGTTIN, SIGTTOU  one worker child more, or fewer, in every pool
    """)

# argparse quotes a refused argument whole ('invalid int value: ...'); a 10 kB one, or 5,000
# digits, would fill the screen. These bound what a usage error line repeats of the input.
_LONG_QUOTED = re.compile(r"'([^'\n]{60})[^'\n]+'")
MAX_USAGE_MESSAGE = 300


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one short line and exit 2, never a usage dump."""

    def error(self, message):
        message = _LONG_QUOTED.sub(r"'\1...'", message)
        if len(message) > MAX_USAGE_MESSAGE:  # 'unrecognized arguments' lists them unquoted
            message = message[:MAX_USAGE_MESSAGE] + "..."
        raise UsageError(f"{self.prog}: {message}")


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", metavar="FILE",
                        help="YAML config file (default: $PGTASKD_CONFIG, else built-in defaults)")


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print JSON for scripts instead of text (timestamps in ISO-8601, UTC)")


def _command(commands, name: str, summary: str, description: str, examples: str):
    description = "\n\n".join(textwrap.fill(paragraph, 79)
                              for paragraph in description.split("\n\n"))
    parser = commands.add_parser(name, help=summary, description=description,
                                 epilog="examples:\n" + textwrap.indent(examples, "  "),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_config(parser)
    _add_json(parser)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pgtaskd", description="A task scheduler coordinated by PostgreSQL.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"pgtaskd {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = commands.add_parser(
        "run", help="run the supervisor daemon", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start the supervisor: it migrates the schema, forks the configured worker "
                    "children and watches them until it is told to stop.",
        epilog=RUN_SIGNALS + "\nexample:\n  pgtaskd run -c /etc/pgtaskd/pgtaskd.yaml")
    _add_config(run)
    run.add_argument("--no-migrate", action="store_true",
                     help="do not apply schema migrations at start (they must be applied already)")
    run.add_argument("--demo", action="store_true",
                     help="submit a few example tasks at start, to watch them being processed")

    worker = commands.add_parser(
        "worker", help="run one worker in the foreground (no supervisor)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a single claim-run-finalize loop in this process, for debugging.",
        epilog="example:\n  pgtaskd worker -c etc/pgtaskd.yaml --pool default")
    _add_config(worker)
    worker.add_argument("--pool", default=None, help="which pool's task types to run "
                                                    "(default: the first pool)")

    _command(
        commands, "migrate", "create or upgrade the database schema",
        "Apply pending schema migrations. Idempotent, and safe when several daemons run it "
        "at once.",
        "pgtaskd migrate -c etc/pgtaskd.yaml\n"
        "PGTASKD_DSN=postgresql://pgtaskd@db/pgtaskd pgtaskd migrate --json")

    _command(
        commands, "check-config", "validate the config and import every handler",
        "Validate the YAML and import every handler in a subprocess. Prints one line per "
        "problem; exits 0 when all is well, 2 otherwise.",
        "pgtaskd check-config -c etc/pgtaskd.yaml")

    bench = _command(
        commands, "bench", "measure throughput, pickup latency and memory",
        "In a schema of its own on the configured database (created and dropped by each run), "
        "measure: submit one task per call; submit_many; the claim-and-complete SQL driven by "
        "bare processes (the ceiling); a real daemon draining --tasks no-op tasks; and the "
        "pickup latency of idle workers (one task submitted at a random moment, time until its "
        "handler starts). Prints every run, the medians, the drain as a percentage of the "
        "ceiling, the daemon's memory and the CPU each process kind spent per task.",
        "pgtaskd bench -c etc/pgtaskd.yaml\n"
        "pgtaskd bench --tasks 20000 --processes 2 --batch-size 10 --runs 5 --json")
    bench.add_argument("--tasks", type=positive_int, default=5000, metavar="N",
                       help="tasks per run for submit_many, the ceiling and the drain "
                            "(default 5000; submit one per call uses at most 5000)")
    bench.add_argument("--processes", type=positive_int, default=2, metavar="N",
                       help="worker processes, for the daemon and the ceiling (default 2)")
    bench.add_argument("--batch-size", type=positive_int, default=1, metavar="N",
                       help="tasks claimed per statement (pools.<name>.batch_size, default 1)")
    bench.add_argument("--runs", type=positive_int, default=3, metavar="N",
                       help="how many runs; the median is reported (default 3)")
    bench.add_argument("--latency-samples", type=non_negative_int, default=200, metavar="N",
                       help="pickup latency samples per run (default 200; 0 skips it)")
    bench.add_argument("--limit", type=limit_value, default=None, metavar="N",
                       help="a global concurrency limit on the drained tasks' type, to "
                            "measure what a limit costs (default: none)")
    bench.add_argument("--work-ms", type=work_milliseconds, default=0.0, metavar="MS",
                       help="each drained task's handler waits MS milliseconds, as on a network "
                            "call (default 0: a no-op)")
    bench.add_argument("--concurrency", type=positive_int, default=1, metavar="N",
                       help="tasks each worker process runs at once (pools.<name>.concurrency, "
                            "default 1)")
    bench.add_argument("--async", dest="async_handler", action="store_true",
                       help="the drained handler is async def, run on each child's event loop")

    fleet = _command(
        commands, "bench-fleet", "measure throughput per added daemon",
        "In a schema of its own on the configured database, drain --tasks no-op tasks with "
        "fleets of 1, 2, 4 and 8 daemons (--daemons), each with --processes workers, at each "
        "batch size, and print the curve: tasks a second, the CPU PostgreSQL's processes spent "
        "per task (read from /proc when the server runs on this host), the cores it kept busy, "
        "and where adding daemons stopped paying.",
        "pgtaskd bench-fleet -c etc/pgtaskd.yaml\n"
        "pgtaskd bench-fleet --daemons 1,2,4,8 --processes 2 --batch-size 1,10 --tasks 20000")
    fleet.add_argument("--daemons", type=positive_int_list, default=(1, 2, 4, 8),
                       metavar="N,N,...", help="the fleet sizes, in order (default 1,2,4,8)")
    fleet.add_argument("--processes", type=positive_int, default=2, metavar="N",
                       help="worker processes of each daemon (default 2)")
    fleet.add_argument("--batch-size", type=positive_int_list, default=(1, 10),
                       metavar="N,N,...", help="tasks claimed per statement, each measured "
                                               "(default 1,10)")
    fleet.add_argument("--tasks", type=positive_int, default=20_000, metavar="N",
                       help="tasks drained at each point (default 20000)")
    fleet.add_argument("--runs", type=positive_int, default=3, metavar="N",
                       help="how many runs; the median is reported (default 3)")

    web = commands.add_parser(
        "web", help="run the web console (or hash a password for its config)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve the web console on web.listen (127.0.0.1:8464 by default): the "
                    "overview, tasks, schedules, limits and pauses, updated live. Read-only "
                    "unless web.actions is true and the user is authenticated. "
                    "'pgtaskd web hash-password' reads a password (from the terminal, or "
                    "one line of stdin) and prints its hash for web.auth.users.",
        epilog="examples:\n  pgtaskd web -c /etc/pgtaskd/pgtaskd.yaml\n"
               "  pgtaskd web hash-password")
    _add_config(web)
    web.add_argument("action", nargs="?", choices=["hash-password"], default=None,
                     help="hash-password: print the hash of a password for web.auth.users")
    web_bench = _command(
        commands, "web-bench", "measure the web console's page timings",
        "In a schema of its own on the configured database (created and dropped by the run), "
        "fill --finished finished and --pending pending tasks, start the console on a free "
        "port of 127.0.0.1, request each page --requests times and print the server time "
        "of each (its Server-Timing header): p50 and p95 in milliseconds.",
        "pgtaskd web-bench -c etc/pgtaskd.yaml\n"
        "pgtaskd web-bench --finished 5000000 --pending 1000000 --requests 200")
    web_bench.add_argument("--finished", type=non_negative_int, default=500_000, metavar="N",
                           help="finished tasks to fill (default 500000)")
    web_bench.add_argument("--pending", type=non_negative_int, default=100_000, metavar="N",
                           help="pending tasks to fill (default 100000)")
    web_bench.add_argument("--requests", type=positive_int, default=100, metavar="N",
                           help="requests per page (default 100)")
    web_bench.add_argument("--keep", action="store_true",
                           help="keep the filled schema (its name is printed) for another run")

    _add_task_commands(commands)
    add_completion_command(commands)
    return parser


def _add_task_commands(commands) -> None:
    submit = _command(
        commands, "submit", "enqueue a task and print its id",
        "Enqueue one task. Prints its id (a new UUID unless --id is given).\n\n"
        "Submitting an --id that exists already writes nothing: the id is printed, a note on "
        "stderr names the existing task's status, the exit status is 0, and --json says "
        '"created": false. So a script may retry a submit safely, as long as it gives --id.\n\n'
        "With --unique-key, at most one PENDING or RUNNING task holds the key: while one "
        "does, a submit with it writes nothing and prints that task's id, with a note on "
        "stderr and exit status 0. Finished tasks do not hold their key.\n\n"
        "A task type that no handler in the config runs is accepted with a warning: a daemon "
        "with another config may run it.",
        "pgtaskd submit echo --payload '{\"text\": \"hello\"}'\n"
        "pgtaskd submit report --payload-file report.json --in 2h --priority 5\n"
        "pgtaskd submit charge --id charge-order-42 --at 2026-01-31T09:00:00+01:00 --json\n"
        "pgtaskd submit refresh --unique-key refresh-customer-7 --in 5m\n"
        "jq -n '{rows: 500}' | pgtaskd submit import --payload-file -")
    submit.add_argument("task_type", metavar="TYPE",
                        help="the task type: a key under handlers.types of the daemon's config")
    body = submit.add_mutually_exclusive_group()
    body.add_argument("--payload", metavar="JSON",
                      help="the payload, a JSON object (default: {}); at most max_payload_bytes "
                           "(1 MiB unless the config says otherwise)")
    body.add_argument("--payload-file", metavar="FILE",
                      help="read the payload JSON object from FILE ('-' for stdin)")
    submit.add_argument("--priority", type=int, default=0, metavar="N",
                        help="higher runs first among due tasks (default: 0; may be negative)")
    when = submit.add_mutually_exclusive_group()
    when.add_argument("--at", type=parse_timestamp, metavar="ISO-8601",
                      help="run no earlier than this time, which must name its time zone "
                           "(like 2026-01-31T09:00:00Z); default: now")
    when.add_argument("--in", dest="delay", type=parse_duration, metavar="DURATION",
                      help="run after this delay from now: 30s, 5m, 2h, 1d, or plain seconds")
    submit.add_argument("--id", metavar="ID",
                        help="the task id (default: a new UUID); an existing id submits nothing")
    submit.add_argument("--unique-key", metavar="KEY",
                        help="while a PENDING or RUNNING task holds KEY, submit nothing and "
                             "print that task's id (printable text, at most 200 characters)")
    submit.add_argument("--name", metavar="NAME",
                        help="a label for people (default: the task type)")
    submit.add_argument("--max-retries", type=int, default=3, metavar="N",
                        help="retries after the first run fails (default: 3, so 4 runs at most)")

    cancel = _command(
        commands, "cancel", "cancel pending or running tasks, by id or by filter",
        "Cancel tasks by id: PENDING or RUNNING become CANCELLED (a running handler learns it "
        "at its next lease renewal). A finished task is refused, naming its status. All or "
        "nothing: if any ID cannot be cancelled, none is.\n\n"
        "Or cancel every PENDING task a filter matches (--since and --before: when it was "
        "submitted), in batches of --batch-size tasks, each committed on its own: RUNNING "
        "tasks are not taken by a filter (cancel them by id). Tasks submitted after the "
        "command started are left alone. --dry-run prints how many it would cancel.",
        "pgtaskd cancel 0b9c4f0e-2d4e-4d6a-9a51-3f1c2d7e8a10\n"
        "pgtaskd cancel charge-order-42 charge-order-43 --json\n"
        "pgtaskd cancel --type report --since 2h --dry-run\n"
        "pgtaskd cancel --type report --id-prefix import- --max 5000")
    cancel.add_argument("ids", nargs="*", metavar="ID", help="ids of the tasks to cancel")
    _add_filter(cancel, "cancel")

    retry = _command(
        commands, "retry", "run failed or cancelled tasks again, by id or by filter",
        "Put FAILED or CANCELLED tasks back to PENDING, due now, with retry_count reset to 0 "
        "and the last error cleared. Any other status is refused. All or nothing: if any ID "
        "cannot be retried, none is.\n\n"
        "Or retry every FAILED or CANCELLED task a filter matches (--since and --before: "
        "when it finished), in batches of --batch-size tasks, each committed on its own. A "
        "task whose unique key a PENDING or RUNNING task holds is refused and counted; "
        "tasks that finish after the command started are left alone. --dry-run prints how "
        "many it would retry.",
        "pgtaskd retry 0b9c4f0e-2d4e-4d6a-9a51-3f1c2d7e8a10\n"
        "pgtaskd retry --type charge --status FAILED --since 1h --error timeout --dry-run\n"
        "pgtaskd retry --type charge --status FAILED --since 1h --error timeout --json")
    retry.add_argument("ids", nargs="*", metavar="ID", help="ids of the tasks to retry")
    _add_filter(retry, "retry")

    purge = _command(
        commands, "purge", "delete finished tasks by filter",
        "Delete every COMPLETED, FAILED or CANCELLED task a filter matches (--since, --before "
        "and --older-than: when it finished), now, beside what retention deletes by age, in "
        "batches of --batch-size tasks, each committed on its own. PENDING and RUNNING tasks "
        "are never deleted. --dry-run prints how many it would delete.",
        "pgtaskd purge --status COMPLETED --type report --older-than 7d --dry-run\n"
        "pgtaskd purge --status COMPLETED --type report --older-than 7d\n"
        "pgtaskd purge --status FAILED --error 'invalid card' --json")
    _add_filter(purge, "purge")

    show = _command(
        commands, "show", "print every field of one task and its last failure",
        "Print every column of one task, the payload as indented JSON, then its latest "
        "failed attempt with its traceback, if it had one. --attempts prints every failed "
        "attempt kept (the last 20), oldest first. --json adds last_failure (null if none) "
        "and, with --attempts, failed_attempts.",
        "pgtaskd show 0b9c4f0e-2d4e-4d6a-9a51-3f1c2d7e8a10\n"
        "pgtaskd show charge-order-42 --attempts\n"
        "pgtaskd show charge-order-42 --json | jq .error_message")
    show.add_argument("id", metavar="ID", help="the task id")
    show.add_argument("--attempts", action="store_true",
                      help="print every failed attempt kept, with its traceback")

    listing = _command(
        commands, "list", "list tasks as a table, most recently updated first",
        "List tasks, most recently updated first: id, type, status, priority, retries "
        "(retry_count/max_retries), scheduled time and last update, in UTC. --json prints an "
        "array with every field of each task.",
        "pgtaskd list\npgtaskd list --status FAILED --type charge --limit 200\n"
        "pgtaskd list --status pending --json")
    listing.add_argument("--status", metavar="S",
                         help="only this status: PENDING, RUNNING, COMPLETED, FAILED or "
                              "CANCELLED (any case)")
    listing.add_argument("--type", metavar="T", help="only this task type")
    listing.add_argument("--limit", type=int, default=50, metavar="N",
                         help="at most N tasks, 1 to 10000 (default: 50)")

    _command(
        commands, "stats", "count tasks by status and type",
        "Count tasks by status and by type, and show how long the oldest due PENDING task has "
        "waited and how many RUNNING tasks hold an expired lease (not yet returned by a "
        "reaper). Paused task types are listed with their due tasks, which are left out of "
        "the due count and the oldest wait; limited types with their limit and how many run.",
        "pgtaskd stats\npgtaskd stats --json | jq .by_status.FAILED")

    pause = _command(
        commands, "pause", "stop every daemon from claiming tasks of these types",
        "Pause task types fleet-wide: no daemon claims a task of these types from its next "
        "claim on, with no restart and whatever its config. Tasks already running finish "
        "normally; new tasks of these types are still accepted and wait. The pause is kept "
        "in the database (it outlives restarts) until 'pgtaskd resume'. Their waiting tasks "
        "do not fail the health check. Pausing a paused type keeps the first pause. All or "
        "nothing.",
        "pgtaskd pause charge\n"
        "pgtaskd pause charge report --json")
    pause.add_argument("task_types", nargs="+", metavar="TYPE", help="task types to pause")

    resume = _command(
        commands, "resume", "let daemons claim tasks of these types again",
        "Resume paused task types: daemons claim their tasks again from their next claim, and "
        "idle workers are woken at once for the tasks that are due. Resuming a type that is "
        "not paused changes nothing (a note says so). All or nothing.",
        "pgtaskd resume charge\n"
        "pgtaskd resume charge report --json")
    resume.add_argument("task_types", nargs="+", metavar="TYPE", help="task types to resume")

    limit = _command(
        commands, "limit", "set or remove a global concurrency limit of a task type",
        "At most N tasks of this type RUNNING at once, across every daemon on this database, "
        "from each daemon's next claim on; 'off' removes the limit and every daemon's claim "
        "on it. The limit is kept in the database. Lowering it stops no running task: the "
        "excess ends as its tasks do. Each daemon whose config has limits: claims them at "
        "start and on each reload that changes them, and the smallest claim is put in force "
        "again, over what this command set.",
        "pgtaskd limit charge 2\n"
        "pgtaskd limit charge off")
    limit.add_argument("task_type", metavar="TYPE", help="the task type")
    limit.add_argument("max_running", metavar="N", type=limit_value,
                       help=f"1 to {MAX_LIMIT}, or 'off'")
    _command(
        commands, "limits", "list the global concurrency limits",
        "List the global concurrency limits: task type, the limit, how many of its tasks run "
        "under a live lease now, and who set it when.",
        "pgtaskd limits\npgtaskd limits --json")
    _command(
        commands, "schedules", "list the periodic tasks of the config",
        "List the schedules of the config: name, cron expression, time zone, task type, the "
        "next run (the first instant after the database's clock) and the last run (the newest "
        "instant any daemon enqueued, with its task's status now; '-' before the first run, "
        "and a status of '-' once retention deleted the task). Times are in UTC. A schedule "
        "whose definition in this config is not the one in force, or that daemons lately "
        "reported with another definition, gets a 'conflict:' line under the table (--json: "
        "conflict, definition, recorded_definition, disagreeing): daemons whose definition "
        "is not the one in force enqueue nothing for it.",
        "pgtaskd schedules -c /etc/pgtaskd/pgtaskd.yaml\n"
        "pgtaskd schedules --json | jq -r '.[] | select(.last_status == \"FAILED\") | .name'")
    daemons = _command(
        commands, "daemons", "list the daemons on this database and what their children run",
        "List the daemon registry: every daemon that ran on this database within a day, "
        "those that run first. Each shows its host and config file, pid, state (starting, "
        "running, reloading, stopping; stopped once it signed off; LOST when its heartbeat "
        "is older than three of its intervals, and 10 s, by the database's clock), "
        "generation (one more per reload), version, when it started and last wrote, and "
        "per pool its children: pid, generation, state (booting, idle, working, stopping) "
        "and the tasks each runs. A daemon writes its row every registry.interval seconds "
        "(5 by default).",
        "pgtaskd daemons\n"
        "pgtaskd daemons --state lost\n"
        "pgtaskd daemons --json | jq -r '.[] | select(.state == \"running\") | .host'")
    daemons.add_argument("--state", metavar="S",
                         help="only daemons in this state: starting, running, reloading, "
                              "stopping, stopped or lost (any case)")
    daemons.add_argument("--limit", type=int, default=100, metavar="N",
                         help="at most N daemons, 1 to 10000 (default: 100)")


def _add_filter(parser: argparse.ArgumentParser, action: str) -> None:
    """The filter of a bulk action: every option given must match."""
    statuses = {"retry": "FAILED or CANCELLED (default: both)",
                "cancel": "PENDING (the only one a filter takes)",
                "purge": "COMPLETED, FAILED or CANCELLED (default: all three)"}[action]
    time = "submitted" if action == "cancel" else "finished"
    verb = {"retry": "retry", "cancel": "cancel", "purge": "delete"}[action]
    group = parser.add_argument_group(
        "filter (instead of ids)" if action != "purge" else "filter")
    group.add_argument("--type", dest="types", action="append", metavar="T",
                       help="only tasks of this type (repeat for several)")
    group.add_argument("--status", dest="statuses", action="append", metavar="S",
                       help=f"only tasks in this status: {statuses}")
    group.add_argument("--since", type=parse_when, metavar="WHEN",
                       help=f"only tasks {time} at or after WHEN: a duration back from now "
                            f"(30m, 2h, 7d) or an ISO-8601 time with its zone")
    when = group.add_mutually_exclusive_group()
    when.add_argument("--before", type=parse_when, metavar="WHEN",
                      help=f"only tasks {time} before WHEN (as --since)")
    if action == "purge":
        when.add_argument("--older-than", dest="before", type=parse_age, metavar="DURATION",
                          help="only tasks finished more than DURATION ago (--before DURATION)")
    group.add_argument("--error", metavar="TEXT",
                       help="only tasks whose last error contains TEXT, in any case "
                            "(%% and _ are plain characters)")
    group.add_argument("--id-prefix", metavar="P", help="only tasks whose id starts with P")
    group.add_argument("--name-prefix", metavar="P",
                       help="only tasks whose name starts with P")
    group.add_argument("--unique-key", metavar="KEY", help="only tasks with this unique key")
    group.add_argument("--dry-run", action="store_true",
                       help=f"{verb} nothing: print how many tasks it would {verb} (counting "
                            f"stops past 10000 unless --max says more)")
    group.add_argument("--max", dest="max_tasks", type=positive_int, metavar="N",
                       help=f"{verb} at most N tasks, then stop")
    group.add_argument("--batch-size", type=positive_int, metavar="N",
                       help="tasks read and written per statement, each batch committed on "
                            "its own (default: 1000, at most 10000)")


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what could not be
    written raises nothing more."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv=None) -> int:
    # A task name or payload in a terminal that cannot show it must not end in a traceback.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a full disk must show here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # `pgtaskd list | head` closed the pipe: not an error worth reporting.
        _silence_stdout()
        return EXIT_FAILURE
    except OutputLost as exc:
        _silence_stdout()
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as exc:
        if exc.filename is not None:
            raise  # a file the command reads, not its output: not ours to word here
        _silence_stdout()
        print(f"error: could not write the output: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"config error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except OperationalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except psycopg.Error as exc:
        # Anything the database refused that no command anticipated: still one line.
        text = str(exc).strip().splitlines()
        print(f"error: PostgreSQL: {text[0] if text else type(exc).__name__}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


# Which module holds each command's cmd_* function.
_COMMAND_MODULES = {
    **dict.fromkeys(["run", "worker", "migrate", "check-config", "bench", "bench-fleet"],
                   "daemon_commands"),
    **dict.fromkeys(["submit", "cancel", "retry", "show", "list", "stats"], "task_commands"),
    "purge": "bulk_commands",
    **dict.fromkeys(["pause", "resume", "limit", "limits", "schedules"], "fleet_commands"),
    "daemons": "registry_commands",
    **dict.fromkeys(["web", "web-bench"], "web_commands"),
    "completion": "completion",
}


def _dispatch(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    # Only now, once the command is known: `pgtaskd --help` and a usage error load neither the
    # client nor the daemon. For speed, not a circle: no command module imports this one.
    commands = importlib.import_module(f".{_COMMAND_MODULES[args.command]}", __name__)
    if args.command == "completion":  # no config: it completes whatever config comes later
        return commands.cmd_completion(args, parser)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        if args.command == "check-config" and args.json:
            print(json.dumps({"ok": False, "problems": exc.problems}))
        raise
    return getattr(commands, "cmd_" + args.command.replace("-", "_"))(args, config)


if __name__ == "__main__":
    sys.exit(main())
