"""Fixtures and helpers the integration tests share: tasks, in-process workers, logged events.

They live here rather than in a second conftest.py: neither tests/ nor tests/integration/ is a
package, so a second conftest.py would take the module name ``conftest`` from tests/conftest.py
and break ``from conftest import wait_until``. Test modules import the helpers and load the
fixtures with ``pytest_plugins = ["worker_fixtures"]``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading

import psycopg
import pytest

from conftest import make_config
from supervisor.logs import LOGGER_NAME
from supervisor.worker.loop import Worker
from supervisor.worker.pools import open_pool
from supervisor.worker.registry import load_handlers


from conftest import add_task, task_row  # noqa: E402,F401 - re-exported for the test modules


def recorded_runs(conn, task_id: str | None = None) -> list[tuple]:
    """(task_id, worker_id, retry_count) of every run the test handlers recorded, in order."""
    if task_id is None:
        rows = conn.execute("SELECT task_id, worker_id, retry_count FROM test_runs ORDER BY at")
    else:
        rows = conn.execute("SELECT task_id, worker_id, retry_count FROM test_runs "
                            "WHERE task_id = %s ORDER BY at", (task_id,))
    return rows.fetchall()


def expire_lease(conn, task_id: str) -> None:
    """Move the clock for one task: its lease ends now, as if its owner stopped renewing."""
    changed = conn.execute("UPDATE tasks SET lease_until = now() - interval '1 millisecond' "
                           "WHERE id = %s AND status = 'RUNNING'", (task_id,)).rowcount
    assert changed == 1, f"task {task_id} is not RUNNING"


def run_until_idle(worker: Worker, limit: int = 100) -> list:
    """Run the worker's loop body until nothing is due; the outcomes, in order."""
    outcomes = []
    for _ in range(limit):
        outcome = worker.run_once()
        if outcome is None:
            return outcomes
        outcomes.append(outcome)
    raise AssertionError(f"still finding due tasks after {limit} runs: {outcomes[-3:]}")


class EventLog(logging.Handler):
    """Collects the structured events pgtaskd emits, from any thread."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self._lock = threading.Lock()
        self._records: list[tuple[str, dict]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event:
            with self._lock:
                self._records.append((event, dict(getattr(record, "fields", {}))))

    def of(self, event: str) -> list[dict]:
        with self._lock:
            return [fields for name, fields in self._records if name == event]

    def names(self) -> list[str]:
        with self._lock:
            return [name for name, _ in self._records]


@pytest.fixture
def events():
    logger = logging.getLogger(LOGGER_NAME)
    log = EventLog()
    old_level = logger.level
    # The root logger's WARNING would drop the INFO events (task_claimed, lease_renewed).
    logger.setLevel(logging.DEBUG)
    logger.addHandler(log)
    yield log
    logger.removeHandler(log)
    logger.setLevel(old_level)


@pytest.fixture
def make_worker(db_dsn):
    """Build an in-process Worker on the test database; its pool closes after the test."""
    pools = []

    def build(config=None, *, worker_id: str = "worker-1", types=None, handlers=None,
              dsn: str | None = None, batch_size: int = 1, leases=None) -> Worker:
        """``dsn`` (default: the test database) is where the worker's connections go, e.g.
        through a tests/tcpproxy.py proxy. ``leases``: as Worker's (default: a keeper
        thread of its own)."""
        config = config or make_config(db_dsn)
        if handlers is None:
            handlers = load_handlers(config.handlers.path, config.handlers.types,
                                     only=tuple(types) if types is not None else None)
        # application_name starts with "pgtaskd", as a daemon's children's do.
        pool = open_pool(dsn or db_dsn, connect_timeout=config.database.connect_timeout,
                         name=f"pgtaskd test {worker_id}")
        pool.open(wait=True, timeout=10)
        worker = Worker(config, pool=pool, handlers=handlers, worker_id=worker_id,
                        batch_size=batch_size, handler_dsn=dsn or db_dsn, leases=leases)
        pools.append((pool, worker))
        return worker

    yield build
    for pool, worker in pools:
        worker.stop()
        worker.leases.stop()
        worker.close()
        pool.close()


@contextlib.contextmanager
def looping(worker: Worker, join_timeout: float = 15.0):
    """Run ``worker.run()`` in a thread for the duration of the block, then stop it."""
    thread = threading.Thread(target=worker.run, name=f"loop-{worker.worker_id}", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(join_timeout)
        assert not thread.is_alive(), f"worker {worker.worker_id} did not stop in {join_timeout} s"


@pytest.fixture
def listener(db_dsn):
    """A connection listening on the wake-up channel the triggers notify."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("LISTEN pgtaskd_tasks")
        yield conn


def received(listener, wait: float = 0.5) -> list[dict]:
    """The notifications that arrive within ``wait`` seconds, decoded."""
    return [json.loads(n.payload) for n in listener.notifies(timeout=wait)]
