"""Entry point of a worker child: ``python -m supervisor.worker.main``.

The supervisor starts each child as a fresh interpreter (never a bare fork of its threaded
self), passes the DSN in the environment (never on the command line, where ``ps`` shows it)
and talks with the child over the socket named by ``--channel-fd`` (supervisor/channel.py);
it writes its claims' states on the board named by ``--claims-fd`` (supervisor/claim_board.py).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import sys
import threading
from typing import Callable

from psycopg_pool import ConnectionPool, PoolTimeout

from .. import proctitle
from ..channel import Link
from ..claim_board import ClaimBoard
from ..config import CONFIG_SNAPSHOT_ENV, DSN_ENV, load_config
from ..db.connect import connect, worker_application_name
from ..errors import EXIT_BOOT_FAILED, EXIT_OK, EXIT_USAGE, ConfigError, OperationalError
from ..logs import TaskOutput, emit, setup_logging
from .leases import SupervisedLeases
from .concurrent import SETTLING_THREADS
from .loop import Worker
from .pools import open_pool
from ..process_tree import become_subreaper
from .registry import load_handlers

# The longest a child waits for its pool's first connection in one try.
MAX_POOL_PATIENCE = 60.0


def make_worker_id(pool: str, slot: int) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{pool}#{slot}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="pgtaskd-worker",
                                     description="One pgtaskd worker (started by the supervisor).")
    parser.add_argument("-c", "--config", help="config file (default: $PGTASKD_CONFIG)")
    parser.add_argument("--pool", default="default", help="the pool this child belongs to")
    parser.add_argument("--slot", type=int, default=1, help="this child's number in its pool")
    parser.add_argument("--claims-fd", type=int, default=None,
                        help="the supervisor's claim board for this child (a memfd)")
    parser.add_argument("--channel-fd", type=int, default=None,
                        help="file descriptor of the pipe to the supervisor")
    parser.add_argument("--supervisor-pid", type=int, default=None,
                        help="stop when this process (the supervisor) is gone")
    return parser.parse_args(argv)


def run_worker(config, *, pool_name: str, slot: int, dsn: str, channel: Link,
               stop_event: threading.Event, on_worker=lambda worker: None,
               board_fd: int | None = None, print_tracebacks: bool = False) -> int:
    """Boot (handlers, database), report it, then loop until stopped. Returns an exit code.
    ``print_tracebacks``: print each failure's traceback on stderr (``pgtaskd worker``)."""
    pool_config = next((p for p in config.pools if p.name == pool_name), None)
    if pool_config is None:
        emit("worker_boot_failed", error=f"pools.{pool_name}: no such pool in the config")
        return EXIT_BOOT_FAILED
    worker_id = make_worker_id(pool_name, slot)
    try:
        handlers = load_handlers(config.handlers.path, config.handlers.types,
                                 only=pool_config.task_types)
    except ConfigError as exc:
        for problem in exc.problems:
            emit("worker_boot_failed", logging.ERROR, worker_id=worker_id, pool=pool_name,
                 error=problem)
        channel.send("boot_failed", error="; ".join(exc.problems)[:3000])
        return EXIT_BOOT_FAILED
    if not wait_for_database(dsn, config.database.connect_timeout, stop_event, channel,
                             worker_id=worker_id, pool_name=pool_name):
        return EXIT_OK
    name = f"pgtaskd {pool_name}#{slot}"
    # A concurrent child's failures and cancellations are written by several threads at once.
    pool = open_when_reachable(
        lambda: open_pool(dsn, connect_timeout=config.database.connect_timeout, name=name,
                          application_name=worker_application_name(worker_id),
                          pooled=config.database.transaction_pooler,
                          max_size=2 if pool_config.concurrency == 1 else 2 + SETTLING_THREADS),
        config.database.connect_timeout, stop_event, channel, worker_id=worker_id,
        pool_name=pool_name)
    if pool is None:
        return EXIT_OK
    try:
        # Under a supervisor, it renews the leases; on its own (pgtaskd worker), a keeper
        # thread of this process does.
        board = None if board_fd is None else ClaimBoard(board_fd, pool_config.board_slots)
        supervised = None if channel.closed else \
            (lambda w: SupervisedLeases(channel, w, pool_name=pool_name, board=board))
        worker = Worker(config, pool=pool, handlers=handlers, worker_id=worker_id,
                        pool_name=pool_name, batch_size=pool_config.batch_size, leases=supervised,
                        handler_dsn=dsn, owns_process=True,
                        max_tasks=pool_config.max_tasks_per_child,
                        max_memory_mb=pool_config.max_memory_mb,
                        concurrency=pool_config.concurrency)
        worker.on_title = lambda state: proctitle.worker_title(pool_name, slot, state)
        worker.print_tracebacks = print_tracebacks
        on_worker(worker)
        if stop_event.is_set():
            return EXIT_OK
        proctitle.worker_title(pool_name, slot, "idle")
        channel.send("booted", pid=os.getpid(), worker_id=worker_id,
                     task_types=list(worker.task_types))
        try:
            worker.run()
        finally:
            worker.close()
        channel.send("stopping", reason=worker.exit_reason)
    finally:
        pool.close()
    return EXIT_OK


def wait_for_database(dsn: str, connect_timeout: float, stop_event: threading.Event,
                      channel: Link, *, worker_id: str, pool_name: str) -> bool:
    """Wait out a database that is down: a child that cannot connect is not broken, and
    exiting would only spin the supervisor's restart loop. The child reports "booted" only
    once connected. False if asked to stop while waiting."""
    delay = 0.5
    warned = False
    while not stop_event.is_set():
        try:
            connect(dsn, connect_timeout=connect_timeout).close()
            return True
        except OperationalError as exc:
            if not warned:
                emit("db_unreachable", logging.ERROR, worker_id=worker_id, pool=pool_name,
                     error=str(exc))
                # Tell the supervisor this child is healthy but waiting: an outage must not
                # count as a failure to boot and blow the pool's fuse.
                channel.send("waiting_db", error=str(exc)[:500])
                warned = True
            stop_event.wait(delay)
            delay = min(delay * 2, 10.0)
    return False


def open_when_reachable(make_pool: Callable[[], ConnectionPool], connect_timeout: float,
                        stop_event: threading.Event, channel: Link, *, worker_id: str,
                        pool_name: str) -> ConnectionPool | None:
    """The child's pool, open with its first connection made and configured; None if asked
    to stop first.

    That takes a connection and then a few statements more, so on a slow path it can take
    longer than connect_timeout even where a bare connection (wait_for_database) made it in
    time. It is tried again, with twice the patience each time (at most a minute), as for a
    database that is down: exiting would only spin the supervisor's restart loop and every
    replacement would fail alike."""
    patience = max(connect_timeout, 1.0)
    warned = False
    while not stop_event.is_set():
        pool = make_pool()
        try:
            pool.open(wait=True, timeout=patience)
            return pool
        except PoolTimeout as exc:  # the pool closed itself
            if not warned:
                emit("db_unreachable", logging.ERROR, worker_id=worker_id, pool=pool_name,
                     error=str(exc))
                channel.send("waiting_db", error=str(exc)[:500])
                warned = True
            patience = min(patience * 2, MAX_POOL_PATIENCE)
    return None


PR_SET_PDEATHSIG = 1


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM or SIGINT, from a thread of its own.

    Why not from the handler: Python runs a signal handler in the main thread between any two
    of its bytecodes, including inside ``Event.clear()`` while that event's lock is held; a
    handler that then sets the same event waits for a lock its own thread holds, forever. The
    worker's loop clears its wake-up event on every pass, so an idle child whose supervisor was
    killed could hang there now and then. The handler only writes a byte, which takes no lock.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # a storm of signals must not block the handler

    def relay() -> None:
        while True:
            try:
                if os.read(read_fd, 1):
                    break
            except InterruptedError:
                continue
        stop()

    threading.Thread(target=relay, name="stop-signal", daemon=True).start()

    def on_signal(signum, frame) -> None:
        try:
            os.write(write_fd, b"s")
        except OSError:
            pass  # a byte is already there: the stop is under way

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def stop_with_parent(parent_pid: int) -> None:
    """Have the kernel send SIGTERM when the supervisor dies, so no orphaned worker goes on
    claiming work that no supervisor reaps, reloads or stops. Linux only; elsewhere, and if
    the supervisor is already gone, the worker simply stops after its current task."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv=None) -> int:
    args = parse_args(argv)
    setup_logging()
    stop_event = threading.Event()
    workers = []

    def request_stop() -> None:
        # The loop finishes its current task, then leaves.
        stop_event.set()
        for worker in workers:
            worker.stop()

    stop_on_signals(request_stop)
    # Reload is the supervisor's business: it replaces children rather than reloading them.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if args.supervisor_pid is not None:
        stop_with_parent(args.supervisor_pid)
    # What a handler starts and abandons is reparented to this child, which kills it after
    # the task (worker/usage.py), rather than to init, where it would outlive everything.
    become_subreaper()
    proctitle.worker_title(args.pool, args.slot, "booting")
    try:
        # The supervisor's snapshot of the file for this child's generation, not the file as it
        # is now: it may have been edited or broken since, without a reload.
        config = load_config(args.config, text=os.environ.get(CONFIG_SNAPSHOT_ENV))
    except ConfigError as exc:
        for problem in exc.problems:
            emit("worker_boot_failed", error=problem)
        return EXIT_USAGE
    setup_logging(config.logging.level, config.logging.format)
    # A line a handler prints names its task, as its log records do.
    sys.stdout = TaskOutput(sys.stdout)
    dsn = os.environ.get(DSN_ENV) or config.database.dsn
    if not dsn:
        emit("worker_boot_failed", error=f"no DSN: the supervisor passes it in ${DSN_ENV}")
        return EXIT_BOOT_FAILED
    channel = Link.from_fd(args.channel_fd)
    code = run_worker(config, pool_name=args.pool, slot=args.slot, dsn=dsn, channel=channel,
                      stop_event=stop_event, on_worker=workers.append, board_fd=args.claims_fd)
    # The interpreter's exit resets our handler to the default, which a late SIGTERM (the
    # supervisor's, after the link's "stop") would make a death by signal.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return code


if __name__ == "__main__":
    sys.exit(main())
