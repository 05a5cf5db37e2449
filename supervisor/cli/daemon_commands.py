"""The commands that run pgtaskd or prepare its ground: ``run``, ``worker``, ``migrate``,
``check-config`` and ``bench``; and the probe that imports the handlers as a worker would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

from ..config import MAX_BATCH_SIZE, MAX_CONCURRENCY, Config
from ..db.connect import connect
from ..db.migrate import migrate
from ..db.redact import redact_dsn
from ..db.session import database_dsn
from ..errors import EXIT_OK, EXIT_USAGE, UsageError, quote
from ..logs import TaskOutput, setup_logging
from .output import print_json


def cmd_migrate(args, config: Config) -> int:
    with database_dsn(config) as dsn:
        with connect(dsn, connect_timeout=config.database.connect_timeout,
                     pooled=config.database.transaction_pooler) as conn:
            applied = migrate(conn, pooled=config.database.transaction_pooler)
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
            "database": redact_dsn(config.database.dsn),
            "data_dir": None if config.database.dsn else str(config.database.data_dir)})
    if problems:
        return EXIT_USAGE
    if not args.json:
        types = ", ".join(sorted(config.handlers.types)) or "(none)"
        pools = ", ".join(f"{p.name}={p.processes}" for p in config.pools)
        schedules = (f", schedules [{', '.join(s.name for s in config.schedules)}]"
                     if config.schedules else "")
        limits = (f", limits [{', '.join(f'{t}={n}' for t, n in sorted(config.limits.items()))}]"
                  if config.limits else "")
        database = (redact_dsn(config.database.dsn) if config.database.dsn
                    else f"embedded in {config.database.data_dir}")
        print(f"config ok: handlers [{types}], pools [{pools}]{schedules}{limits}, "
              f"database {database}")
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
    """One worker loop in this process: for debugging a handler without the supervisor. It
    prints each failure's traceback on stderr, as Python prints it."""
    # Imported here, not for a circle: migrate and check-config need neither the worker
    # nor the daemon, and start faster without them.
    from ..channel import Link
    from ..worker.main import run_worker, stop_on_signals

    setup_logging(config.logging.level, config.logging.format)
    sys.stdout = TaskOutput(sys.stdout)
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
            migrate(conn, pooled=config.database.transaction_pooler)
        return run_worker(config, pool_name=pool_name, slot=1, dsn=dsn,
                          channel=Link(None, blocking=True), stop_event=stop_event,
                          on_worker=workers.append, print_tracebacks=True)


def cmd_bench(args, config: Config) -> int:
    # As in cmd_worker: speed, not a circle.
    from .bench import run_bench
    from .bench_database import Options

    if args.batch_size > MAX_BATCH_SIZE:
        raise UsageError(f"--batch-size: must be at most {MAX_BATCH_SIZE}, got {args.batch_size}")
    if args.concurrency > MAX_CONCURRENCY:
        raise UsageError(f"--concurrency: must be at most {MAX_CONCURRENCY}, got "
                         f"{args.concurrency}")
    if args.concurrency > 1 and args.batch_size > 1:
        raise UsageError("--batch-size: must be 1 with --concurrency above 1 (a concurrent "
                         "child claims as much as it has room for)")
    return run_bench(config, Options(tasks=args.tasks, processes=args.processes,
                                     batch_size=args.batch_size, runs=args.runs,
                                     latency_samples=args.latency_samples, limit=args.limit,
                                     work_ms=args.work_ms, concurrency=args.concurrency,
                                     async_handler=args.async_handler, as_json=args.json))


def cmd_bench_fleet(args, config: Config) -> int:
    from .bench_fleet import FleetOptions, run_fleet_bench  # as in cmd_worker

    if max(args.batch_size) > MAX_BATCH_SIZE:
        raise UsageError(f"--batch-size: must be at most {MAX_BATCH_SIZE}, got "
                         f"{max(args.batch_size)}")
    return run_fleet_bench(config, FleetOptions(
        tasks=args.tasks, daemons=args.daemons, processes=args.processes,
        batch_sizes=args.batch_size, runs=args.runs, as_json=args.json))


def cmd_run(args, config: Config) -> int:
    from ..daemon.arbiter import Arbiter  # as in cmd_worker: speed, not a circle

    setup_logging(config.logging.level, config.logging.format)
    return Arbiter(config, migrate_on_start=not args.no_migrate, demo=args.demo).run()
