"""What each ``pgtaskd`` command does, once its arguments are parsed and its config loaded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from .config import Config
from .db import store
from .db.connect import connect, redact_dsn
from .db.migrate import migrate
from .db.session import database_dsn
from .errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError, UsageError
from .logs import emit, setup_logging


def cmd_migrate(args, config: Config) -> int:
    with database_dsn(config) as dsn:
        with connect(dsn, connect_timeout=config.database.connect_timeout) as conn:
            applied = migrate(conn)
    if applied:
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
    if problems:
        return EXIT_USAGE
    types = ", ".join(sorted(config.handlers.types)) or "(none)"
    pools = ", ".join(f"{p.name}={p.processes}" for p in config.pools)
    print(f"config ok: handlers [{types}], pools [{pools}], database {redact_dsn(config.database.dsn)}")
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
    from .channel import ChildChannel
    from .worker.main import run_worker

    setup_logging()
    pool_name = args.pool or (config.pools[0].name if config.pools else None)
    if pool_name is None or pool_name not in {p.name for p in config.pools}:
        raise UsageError(f"--pool: no pool named {args.pool!r} in the config")
    stop_event = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_event.set())
    with database_dsn(config) as dsn:
        with connect(dsn, connect_timeout=config.database.connect_timeout) as conn:
            migrate(conn)
        return run_worker(config, pool_name=pool_name, slot=1, dsn=dsn, channel=ChildChannel(None),
                          stop_event=stop_event)


def cmd_run(args, config: Config) -> int:
    from .arbiter import Arbiter

    setup_logging()
    return Arbiter(config, migrate_on_start=not args.no_migrate, demo=args.demo).run()
