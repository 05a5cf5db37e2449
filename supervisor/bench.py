"""``pgtaskd bench``: measured throughput of a real daemon on a real database.

Each run starts ``pgtaskd run`` as a subprocess with one pool of no-op workers, waits until
every worker booted, submits the tasks in one statement, and times how long the daemon takes
to complete them all. It prints every run and the median: machines are shared and noisy, so
one run proves little. Everything happens in a schema of its own (through ``search_path``),
dropped afterwards, so it never touches the operator's tasks.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .config import DSN_ENV, Config
from .db import store
from .db.connect import connect
from .db.migrate import migrate
from .db.session import database_dsn
from .errors import OperationalError

BOOT_PATIENCE = 60.0
POLL = 0.02


def noop(task) -> None:
    """The benchmark's handler: all the cost measured is pgtaskd's own."""


def _schema_dsn(dsn: str, schema: str) -> str:
    params = conninfo_to_dict(dsn)
    params["options"] = (params.get("options", "") + f" -csearch_path={schema}").strip()
    return make_conninfo(**params)


def _count(conn, status: str) -> int:
    return store.count_by_status(conn).get(status, 0)


def run_once(dsn: str, *, tasks: int, processes: int, poll_interval: float, workdir: Path) -> dict:
    schema = f"pgtaskd_bench_{uuid.uuid4().hex[:8]}"
    with connect(dsn) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    bench_dsn = _schema_dsn(dsn, schema)
    config_path = workdir / f"{schema}.yaml"
    config_path.write_text(json.dumps({
        "poll_interval": poll_interval,
        "handlers": {"path": str(workdir), "types": {"noop": "supervisor.bench:noop"}},
        "pools": {"bench": {"processes": processes}},
        "metrics": {"listen": ""},
        "shutdown_timeout": 10,
    }))
    log = open(workdir / f"{schema}.log", "w")
    daemon = None
    try:
        with connect(bench_dsn) as conn:
            migrate(conn)
            daemon = subprocess.Popen(
                [sys.executable, "-m", "supervisor.cli", "run", "-c", str(config_path)],
                env={**os.environ, DSN_ENV: bench_dsn}, stdout=subprocess.DEVNULL, stderr=log,
                start_new_session=True)
            _wait_booted(conn, schema, processes, daemon)
            started = time.monotonic()
            for offset in range(0, tasks, 5000):
                _submit(conn, range(offset, min(tasks, offset + 5000)))
            submitted = time.monotonic() - started
            while _count(conn, "COMPLETED") < tasks:
                if daemon.poll() is not None:
                    raise OperationalError(f"the daemon exited ({daemon.returncode}); "
                                           f"see {log.name}")
                time.sleep(POLL)
            elapsed = time.monotonic() - started
            others = {k: v for k, v in store.count_by_status(conn).items() if k != "COMPLETED"}
        return {"tasks": tasks, "processes": processes, "seconds": round(elapsed, 3),
                "tasks_per_second": round(tasks / elapsed, 1),
                "submit_seconds": round(submitted, 3), "not_completed": others}
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        log.close()
        with connect(dsn) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def _submit(conn, numbers: range) -> None:
    from .client import Client

    Client(conn).submit_many({"task_type": "noop", "task_id": f"bench-{n}", "payload": {"n": n}}
                             for n in numbers)


def _wait_booted(conn, schema: str, processes: int, daemon: subprocess.Popen) -> None:
    """Every worker holds a connection named ``pgtaskd bench#N`` once it booted."""
    deadline = time.monotonic() + BOOT_PATIENCE
    while time.monotonic() < deadline:
        booted = conn.execute(
            "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
            "WHERE application_name LIKE 'pgtaskd bench#%%' AND datname = current_database()"
        ).fetchone()[0]
        if booted >= processes:
            return
        if daemon.poll() is not None:
            raise OperationalError(f"the benchmark daemon exited with {daemon.returncode}")
        time.sleep(0.05)
    raise OperationalError(f"{processes} workers did not boot within {BOOT_PATIENCE:g} s")


def run_bench(config: Config, *, tasks: int, processes: int, runs: int, as_json: bool) -> int:
    with database_dsn(config) as dsn, tempfile.TemporaryDirectory(prefix="pgtaskd-bench-") as tmp:
        results = []
        for number in range(1, runs + 1):
            result = run_once(dsn, tasks=tasks, processes=processes,
                              poll_interval=config.poll_interval, workdir=Path(tmp))
            results.append(result)
            if not as_json:
                print(f"run {number}: {tasks} tasks, {processes} workers: {result['seconds']:.2f} s, "
                      f"{result['tasks_per_second']:.0f} tasks/s "
                      f"(submit {result['submit_seconds']:.2f} s)", flush=True)
    median = statistics.median(r["tasks_per_second"] for r in results)
    if as_json:
        print(json.dumps({"runs": results, "median_tasks_per_second": median}, indent=2))
    else:
        print(f"median: {median:.0f} tasks/s over {runs} runs")
    return 0
