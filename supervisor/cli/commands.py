"""What each ``pgtaskd`` command does, once its arguments are parsed and its config loaded."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from datetime import datetime, timezone

from ..client import STATUSES, Client, TaskNotFound, TaskStateError
from ..config import MAX_BATCH_SIZE, Config
from ..db.connect import connect
from ..db.migrate import migrate
from ..db.redact import redact_dsn
from ..db.session import database_dsn
from ..db.store import StoredJson
from ..errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, UsageError, quote
from ..logs import setup_logging


def cmd_migrate(args, config: Config) -> int:
    with database_dsn(config) as dsn:
        with connect(dsn, connect_timeout=config.database.connect_timeout,
                     pooled=config.database.transaction_pooler) as conn:
            applied = migrate(conn)
    if args.json:
        print_json({"applied": [f"{m.version:04d}_{m.name}" for m in applied]})
    elif applied:
        for migration in applied:
            print(f"applied {migration.version:04d}_{migration.name}")
    else:
        print("schema is up to date")
    return EXIT_OK


def cmd_check_config(args, config: Config) -> int:
    """The config parsed (or main() reported why not); now import every handler."""
    problems = import_handlers_in_subprocess(config)
    for problem in problems:
        print(f"config error: {problem}", file=sys.stderr)
    warnings = config.warnings()
    for warning in warnings:
        print(f"config warning: {warning}", file=sys.stderr)
    if args.json:
        print_json({"ok": False, "problems": problems, "warnings": warnings} if problems else {
            "ok": True, "handlers": dict(config.handlers.types),
            "pools": {p.name: {"processes": p.processes, "task_types": list(p.task_types)}
                      for p in config.pools},
            "schedules": {s.name: {"cron": s.cron.expression, "timezone": s.cron.timezone,
                                   "task_type": s.task_type} for s in config.schedules},
            "limits": dict(config.limits),
            "warnings": warnings,
            "database": redact_dsn(config.database.dsn)})
    if problems:
        return EXIT_USAGE
    if not args.json:
        types = ", ".join(sorted(config.handlers.types)) or "(none)"
        pools = ", ".join(f"{p.name}={p.processes}" for p in config.pools)
        schedules = (f", schedules [{', '.join(s.name for s in config.schedules)}]"
                     if config.schedules else "")
        limits = (f", limits [{', '.join(f'{t}={n}' for t, n in sorted(config.limits.items()))}]"
                  if config.limits else "")
        print(f"config ok: handlers [{types}], pools [{pools}]{schedules}{limits}, "
              f"database {redact_dsn(config.database.dsn)}")
    return EXIT_OK


_IMPORT_PROBE = """
import json, sys
from supervisor.config import load_config
from supervisor.errors import ConfigError
from supervisor.worker.registry import load_handlers
config = load_config(sys.argv[1] or None)
try:
    load_handlers(config.handlers.path, config.handlers.types)
    print(json.dumps([]))
except ConfigError as exc:
    print(json.dumps(exc.problems))
"""


def import_handlers_in_subprocess(config: Config, timeout: float = 60.0) -> list[str]:
    """Import the handlers in a fresh interpreter, as a worker child would.

    The supervisor never imports handler code itself: a handler's import side effects, or a
    module cached in the parent, would defeat reloading.
    """
    try:
        result = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE, str(config.path or "")],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
    except subprocess.TimeoutExpired:
        return [f"handlers: importing the handlers took longer than {timeout:g} s"]
    lines = result.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else [f"handlers: import probe failed: "
                                                    f"{result.stderr.strip()[-300:]}"]
    except ValueError:
        return [f"handlers: import probe printed {lines[-1][:200]!r}"]


def cmd_worker(args, config: Config) -> int:
    """One worker loop in this process: for debugging a handler without the supervisor."""
    from ..channel import Link
    from ..worker.main import run_worker, stop_on_signals

    setup_logging()
    pool_name = args.pool or (config.pools[0].name if config.pools else None)
    if pool_name is None or pool_name not in {p.name for p in config.pools}:
        raise UsageError(f"--pool: no pool named {quote(args.pool)} in the config")
    stop_event = threading.Event()
    workers = []

    def request_stop() -> None:
        stop_event.set()
        for worker in workers:
            worker.stop()

    stop_on_signals(request_stop)
    with database_dsn(config) as dsn:
        with connect(dsn, connect_timeout=config.database.connect_timeout,
                     pooled=config.database.transaction_pooler) as conn:
            migrate(conn)
        return run_worker(config, pool_name=pool_name, slot=1, dsn=dsn,
                          channel=Link(None, blocking=True), stop_event=stop_event,
                          on_worker=workers.append)


def cmd_bench(args, config: Config) -> int:
    from .bench import Options, run_bench

    if args.batch_size > MAX_BATCH_SIZE:
        raise UsageError(f"--batch-size: must be at most {MAX_BATCH_SIZE}, got {args.batch_size}")
    return run_bench(config, Options(tasks=args.tasks, processes=args.processes,
                                     batch_size=args.batch_size, runs=args.runs,
                                     latency_samples=args.latency_samples, limit=args.limit,
                                     as_json=args.json))


def cmd_run(args, config: Config) -> int:
    from ..daemon.arbiter import Arbiter

    setup_logging()
    return Arbiter(config, migrate_on_start=not args.no_migrate, demo=args.demo).run()


# --- Task commands: submit, cancel, retry, show, list, stats --------------------------------


class _Refused(Exception):
    """Leaves a ``client.transaction()`` block so that it rolls back, with nothing to report."""


# The client names a bad value by its parameter; the command line, by the argument typed.
_ARGUMENTS = {"task_type": "TYPE", "task_id": "--id", "name": "--name",
              "priority": "--priority", "max_retries": "--max-retries",
              "unique_key": "--unique-key", "run_at": "--at", "delay": "--in",
              "max_running": "N"}


@contextlib.contextmanager
def arguments_named():
    """A client's UsageError, reworded to name the command-line argument."""
    try:
        yield
    except UsageError as exc:
        field, colon, rest = str(exc).partition(":")
        if colon and field in _ARGUMENTS:
            raise UsageError(f"{_ARGUMENTS[field]}:{rest}") from None
        raise


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
    if args.json:
        print_json({"id": task_id, "created": task_id.created, "status": status})
    else:
        print(task_id)
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


def read_payload(text: str | None, path: str | None, max_bytes: int) -> dict | None:
    """The --payload or --payload-file JSON object, or None when neither was given."""
    if text is not None:
        source = "--payload"
        try:
            raw = text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError("--payload: is not valid UTF-8") from None
    elif path is not None:
        source = f"--payload-file {path}"
        raw = _read_limited(path, max_bytes)
    else:
        return None
    # The client checks the stored (compact) size again; this bound keeps a huge input from
    # being parsed at all.
    if len(raw) > max_bytes:
        raise UsageError(f"{source}: more than the maximum payload of {max_bytes} bytes "
                         f"(max_payload_bytes)")
    try:
        payload = json.loads(raw.decode("utf-8-sig"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise UsageError(f"{source}: is not valid UTF-8") from None
    except RecursionError:
        raise UsageError(f"{source}: JSON nested too deeply") from None
    except ValueError as exc:
        raise UsageError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean",
                type(None): "null"}.get(type(payload), "a number")
        raise UsageError(f'{source}: must be a JSON object, like {{"key": "value"}}, got {kind}: '
                         f"{_shorten(raw.decode('utf-8', 'replace'))}")
    return payload


def _read_limited(path: str, max_bytes: int) -> bytes:
    try:
        if path == "-":
            return sys.stdin.buffer.read(max_bytes + 1)
        with open(path, "rb") as stream:
            return stream.read(max_bytes + 1)
    except OSError as exc:
        raise UsageError(f"--payload-file: cannot read {path}: {exc.strerror or exc}") from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _shorten(text: str, width: int = 40) -> str:
    text = printable(text.strip())
    return text if len(text) <= width else text[:width - 3] + "..."


def cmd_cancel(args, config: Config) -> int:
    return _change_all(args, config, Client.cancel, "cancelled", "CANCELLED")


def cmd_retry(args, config: Config) -> int:
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


def cmd_show(args, config: Config) -> int:
    with Client.from_config(config) as client:
        task = client.get(args.id)
    if task is None:
        raise TaskNotFound(args.id)
    if args.json:
        print_json(task)
        return EXIT_OK
    if isinstance(task["payload"], StoredJson):
        print(f"note: task {printable(task['id'])}: the payload is shown as PostgreSQL stores "
              f"it, as Python cannot read it ({task['payload'].reason})", file=sys.stderr)
    width = max(len(column) for column in task) + 2
    # The payload may run over many lines: last, so that it does not split the fields.
    columns = [c for c in task if c != "payload"] + ["payload"]
    for column in columns:
        lines = [printable(line) for line in _shown(column, task[column]).splitlines() or [""]]
        print(column.ljust(width) + ("\n" + " " * width).join(lines))
    return EXIT_OK


def _shown(column: str, value) -> str:
    if isinstance(value, StoredJson):
        return str(value)
    if column == "payload":
        return json.dumps(value, indent=2, ensure_ascii=False)
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return human_time(value)
    return str(value)


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


def cmd_stats(args, config: Config) -> int:
    with Client.from_config(config) as client:
        stats = client.stats()
    if args.json:
        print_json(stats)
        return EXIT_OK
    counts = ", ".join(f"{status} {stats['by_status'][status]}" for status in STATUSES)
    print(f"tasks: {stats['total']} ({counts})")
    age = stats["oldest_pending_age"]
    waiting = f", the oldest waiting {age:.1f} s" if age is not None else ""
    print(f"due pending: {stats['due_pending']}{waiting}")
    print(f"expired leases: {stats['expired_leases']}")
    for pause in stats["paused_types"]:
        due = pause["due_pending"]
        print(f"paused: {printable(pause['task_type'])} since {human_time(pause['paused_at'])} "
              f"by {printable(pause['paused_by'] or '?')} "
              f"({due} due task{'' if due == 1 else 's'} waiting)")
    for limit in stats["limits"]:
        print(f"limited: {printable(limit['task_type'])} to {limit['max_running']} at once "
              f"({limit['running']} running)")
    if stats["by_type"]:
        print()
        print(render_table(
            ["TYPE", *STATUSES, "TOTAL"],
            [[task_type, *(str(by_status[s]) for s in STATUSES), str(sum(by_status.values()))]
             for task_type, by_status in stats["by_type"].items()],
            right_aligned={*STATUSES, "TOTAL"}))
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
    return EXIT_OK


def print_json(value) -> None:
    """JSON on stdout: ASCII-only, so any terminal or pipe carries it intact.

    A task's StoredJson payload is written as the JSON text it is, not as a string: scripts
    get the same shape for every task, and the value PostgreSQL holds, digit for digit.
    """
    stored: list[str] = []

    def marked(task):
        if isinstance(task, dict) and isinstance(task.get("payload"), StoredJson):
            stored.append(task["payload"])
            return {**task, "payload": _stored_marker(len(stored) - 1)}
        return task

    value = [marked(task) for task in value] if isinstance(value, list) else marked(value)
    text = json.dumps(value, default=_json_value, indent=2)
    for index, payload in enumerate(stored):
        text = text.replace(json.dumps(_stored_marker(index)), _ascii_json(payload), 1)
    print(text)


def _stored_marker(index: int) -> str:
    # jsonb cannot hold U+0000, so no real value is ever printed as this.
    return f"\x00stored payload {index}\x00"


def _ascii_json(text: str) -> str:
    """JSON text with every non-ASCII character escaped (they occur only inside strings)."""
    return re.sub(r"[^\x00-\x7f]", lambda m: json.dumps(m[0])[1:-1], text)


def _json_value(value):
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).isoformat()
    raise TypeError(f"cannot print {type(value).__name__} as JSON")


def human_time(value: datetime | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):  # a time a datetime cannot hold, as PostgreSQL writes it
        return value
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def printable(text: str) -> str:
    """Text with control characters escaped: a task id must not drive the terminal."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in str(text))


def render_table(headers: list[str], rows: list[list[str]], *,
                 right_aligned: set[str] = frozenset()) -> str:
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(cells[i]) for cells in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for cells in [headers, *rows]:
        padded = [cell.rjust(width) if header in right_aligned else cell.ljust(width)
                  for header, cell, width in zip(headers, cells, widths)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)
