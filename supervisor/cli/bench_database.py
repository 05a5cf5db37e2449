"""The bench's ground and its measurements of the database alone, with no daemon around.

A scratch schema per run; ``Client.submit`` one task per call and ``Client.submit_many``;
and the ceiling: the worker's own claim-and-complete statement driven by bare processes
(``python -m supervisor.cli.bench ceiling N``, which runs ``ceiling_worker``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..client import Client
from ..config import DSN_ENV
from ..db import store
from ..db.connect import connect
from ..db.migrate import migrate
from ..errors import OperationalError
from ..worker.pools import use_generic_plans

CHUNK = 10_000


@dataclass(frozen=True)
class Options:
    """What one ``pgtaskd bench`` measures, how often, and how it reports."""

    tasks: int = 5000
    processes: int = 2
    batch_size: int = 1
    runs: int = 3
    latency_samples: int = 200
    limit: int | None = None
    """A global concurrency limit on the drained type (limits.<type>), to measure its cost."""
    work_ms: float = 0.0
    """How long each drained task's handler waits (0: a no-op), as a network call would."""
    concurrency: int = 1
    """Tasks each worker process runs at once (pools.<name>.concurrency)."""
    async_handler: bool = False
    """The drained handler is ``async def`` (run on the child's event loop) rather than plain."""
    as_json: bool = False


def _schema_dsn(dsn: str, schema: str) -> str:
    params = conninfo_to_dict(dsn)
    params["options"] = (params.get("options", "") + f" -csearch_path={schema}").strip()
    return make_conninfo(**params)


@contextlib.contextmanager
def scratch_schema(dsn: str, *, keep: bool = False):
    """A new schema, migrated, for as long as the block runs (``keep``: left in place, its
    name on stderr)."""
    schema = f"pgtaskd_bench_{uuid.uuid4().hex[:8]}"
    with connect(dsn) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        bench_dsn = _schema_dsn(dsn, schema)
        with connect(bench_dsn) as conn:
            migrate(conn)
        yield bench_dsn
    finally:
        if keep:
            print(f"kept schema {schema}", file=sys.stderr)
        else:
            with connect(dsn) as admin:
                admin.execute(f"DROP SCHEMA {schema} CASCADE")


def noop_tasks(count: int, task_type: str = "noop"):
    return ({"task_type": task_type, "payload": {"n": n}} for n in range(count))


def measure_submit(dsn: str, count: int, progress) -> float:
    with connect(dsn) as conn:
        client = Client(conn)
        started = time.monotonic()
        for n in range(count):
            client.submit("noop", {"n": n})
            if n % 500 == 0:
                progress(f"submit {n:,}/{count:,}")
        elapsed = time.monotonic() - started
        conn.execute("TRUNCATE tasks, task_attempts")
    return count / elapsed


def measure_submit_many(dsn: str, count: int, progress) -> float:
    with connect(dsn) as conn:
        progress(f"submit_many {count:,}")
        started = time.monotonic()
        for offset in range(0, count, CHUNK):
            Client(conn).submit_many(noop_tasks(min(CHUNK, count - offset)))
        elapsed = time.monotonic() - started
        conn.execute("TRUNCATE tasks, task_attempts")
    return count / elapsed


def tasks_left(conn) -> int:
    return conn.execute("SELECT count(*) FROM tasks WHERE status IN ('PENDING', 'RUNNING')"
                        ).fetchone()[0]


def any_tasks_left(conn) -> bool:
    """Cheap enough to ask every POLL without taking CPU from what is measured (a count
    over thousands of rows every few milliseconds does)."""
    return conn.execute("SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'PENDING') "
                        "OR EXISTS (SELECT 1 FROM tasks WHERE status = 'RUNNING')").fetchone()[0]


def measure_ceiling(dsn: str, options: Options, progress) -> float:
    """The daemon's claim-and-complete statement from bare processes: the database's limit."""
    with connect(dsn) as conn:
        for offset in range(0, options.tasks, CHUNK):
            Client(conn).submit_many(noop_tasks(min(CHUNK, options.tasks - offset)))
        progress(f"ceiling: {options.processes} processes")
        workers = [subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli.bench", "ceiling", str(options.batch_size)],
            env={**os.environ, DSN_ENV: dsn}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True) for _ in range(options.processes)]
        try:
            for worker in workers:
                if worker.stdout.readline().strip() != "ready":
                    raise OperationalError("a ceiling process failed to start")
            started = time.monotonic()
            for worker in workers:
                worker.stdin.write("go\n")
                worker.stdin.flush()
            done = sum(int(worker.stdout.readline() or 0) for worker in workers)
            elapsed = time.monotonic() - started
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                worker.wait()
        if done != options.tasks or tasks_left(conn):
            raise OperationalError(f"the ceiling processes completed {done} of {options.tasks}")
        conn.execute("TRUNCATE tasks, task_attempts")
    return options.tasks / elapsed


def ceiling_worker(batch_size: int) -> int:
    """One bare claim-and-complete loop (``python -m supervisor.cli.bench ceiling N``)."""
    worker_id = f"ceiling:{os.getpid()}"
    with connect(os.environ[DSN_ENV]) as conn:
        use_generic_plans(conn)
        print("ready", flush=True)
        sys.stdin.readline()
        done: list[store.Claim] = []
        completed = 0
        while True:
            landed, rows = store.complete_and_claim(conn, done, worker_id=worker_id,
                                                    task_types=["noop"], lease_seconds=30,
                                                    limit=batch_size)
            completed += len(landed)
            if not rows:
                break
            done = [store.Claim(row["id"], worker_id, row["lease_token"]) for row in rows]
    print(completed, flush=True)
    return 0
