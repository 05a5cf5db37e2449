"""Regression tests for the review findings fixed in d810a2d, on the in-process Worker.

Real PostgreSQL throughout: connection failures are real ones (a backend terminated while its
write waits on a row lock, a TCP path that stops relaying), never a patched store function.

- a final write retried after a dropped connection must not mistake the reaper's change of
  the row for its own landed write (the reaper now clears lease_token);
- generator handlers are refused at load (async ones run), and unrun work returned at run time
  fails the task instead of completing it;
- a NUL byte in a handler's error message no longer leaves the task RUNNING;
- a password that libpq quotes from a malformed DSN is scrubbed, in the library and the CLI;
- a connection that stops relaying cannot hide a lost lease from the handler, nor hang the
  worker once the handler stopped.

A final write sent on a connection whose peer stopped answering but still acknowledges TCP
(a hung proxy) used to wait forever, since neither libpq nor psycopg's blocking API has a read
timeout; it was a strict xfail until every statement of the worker got a read deadline.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from conftest import TEST_HANDLERS, add_task, make_config, task_row, wait_until
from supervisor.db import store
from supervisor.db.connect import connect
from supervisor.errors import ConfigError, OperationalError
from supervisor.worker.loop import Worker
from supervisor.worker.registry import load_handlers
from tcpproxy import TcpProxy

pytest_plugins = ["worker_fixtures"]


def review_config(dsn: str, types: dict[str, str], **tree):
    """A test config whose handler types are exactly ``types`` (module:function)."""
    return make_config(dsn, handlers={"path": str(TEST_HANDLERS), "types": types}, **tree)


# -- 1. a retried final write vs the reaper ---------------------------------------------------


def backend_waiting_on_a_lock(conn, application_name: str) -> int | None:
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
        "AND wait_event_type = 'Lock' AND datname = current_database()",
        (application_name,)).fetchone()
    return row[0] if row else None


@pytest.mark.parametrize("max_retries, reaped_to", [(3, "PENDING"), (0, "FAILED")])
def test_a_completion_retried_after_the_reaper_settled_the_task_is_stale(
        conn, db_dsn, make_worker, events, max_retries, reaped_to):
    """The complete write dies with its connection; meanwhile the lease expires and the reaper
    requeues (or fails) the task. The retried write changes no row, and the row must not be
    taken for our own earlier write having landed: the result is stale, not completed."""
    config = make_config(db_dsn)
    worker = make_worker(config, types=["echo"], worker_id="worker-1")
    handler_may_return = threading.Event()
    worker.handlers["echo"] = lambda task: handler_may_return.wait(30)
    add_task(conn, "t1", max_retries=max_retries)
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(worker.run_once()), daemon=True)
    runner.start()
    # An operator session (or a slow reaper) holds the row: the final write will wait on it.
    locker = psycopg.connect(db_dsn)
    try:
        wait_until(lambda: task_row(conn, "t1")["status"] == "RUNNING", message="the claim")
        token = task_row(conn, "t1")["lease_token"]
        locker.execute("SELECT 1 FROM tasks WHERE id = 't1' FOR UPDATE")
        handler_may_return.set()
        writer = wait_until(lambda: backend_waiting_on_a_lock(conn, "pgtaskd test worker-1"),
                            message="the complete write to wait on the row lock")
        # The connection drops mid-write: a real one, the backend is terminated.
        assert conn.execute("SELECT pg_terminate_backend(%s, 5000)", (writer,)).fetchone()[0]
        wait_until(lambda: events.of("final_write_retry"), message="the write to be retried")

        # Meanwhile the lease expired, and the reaper settles the task.
        locker.execute("UPDATE tasks SET lease_until = now() - interval '1 millisecond' "
                       "WHERE id = 't1'")
        reaped = store.reap_expired_leases(locker, batch_size=10, retry=config.retry)
        assert [(r["id"], r["status"]) for r in reaped] == [("t1", reaped_to)]
        locker.commit()
    finally:
        handler_may_return.set()
        locker.close()
    runner.join(30)
    assert not runner.is_alive(), "the retried final write never returned"

    assert outcome[0].name == "stale", outcome
    assert not events.of("task_completed")
    stale = events.of("stale_result_discarded")
    assert len(stale) == 1 and stale[0]["result"] == "completed", stale
    assert stale[0]["token"] == token
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["claimed_by"], stored["lease_token"]) == \
        (reaped_to, None, None), stored
    assert "expired: the worker stopped renewing it" in stored["error_message"]


# -- 2. async and generator handlers ----------------------------------------------------------


@pytest.mark.parametrize("function", ["generator_send", "async_generator_send"])
def test_load_handlers_refuses_generator_functions_naming_the_type(function):
    with pytest.raises(ConfigError) as caught:
        load_handlers(TEST_HANDLERS, {"echo": "basic:echo",
                                      "mail": f"review_handlers:{function}"})
    problems = caught.value.problems
    assert len(problems) == 1, problems
    assert problems[0].startswith("handlers.types.mail: "), problems
    assert f"review_handlers:{function}" in problems[0], problems
    assert "generator function" in problems[0], problems


def test_an_async_handler_runs_to_its_end_in_a_one_at_a_time_worker(conn, db_dsn, make_worker):
    config = review_config(db_dsn, {"mail": "review_handlers:async_send"})
    worker = make_worker(config)
    add_task(conn, "mail-async", "mail")

    assert worker.run_once().name == "completed"
    assert task_row(conn, "mail-async")["status"] == "COMPLETED"
    assert "mail-async" in sys.modules["review_handlers"].SENT


@pytest.mark.parametrize("function, returned", [("returns_coroutine", "coroutine"),
                                                ("returns_generator", "generator")])
def test_a_handler_that_returns_unrun_work_fails_for_good_instead_of_completing(
        conn, db_dsn, make_worker, events, function, returned):
    # A plain def passes the load-time check; what it returns is caught when it runs.
    config = review_config(db_dsn, {"lazy": f"review_handlers:{function}"})
    worker = make_worker(config)
    add_task(conn, "mail-1", "lazy", max_retries=3)

    outcome = worker.run_once()

    assert outcome.name == "failed", outcome
    stored = task_row(conn, "mail-1")
    assert (stored["status"], stored["retry_count"]) == ("FAILED", 0), stored
    assert "PermanentError" in stored["error_message"], stored["error_message"]
    assert returned in stored["error_message"], stored["error_message"]
    assert not events.of("task_completed")
    failed = events.of("task_failed")
    assert len(failed) == 1 and failed[0]["permanent"] is True, failed
    assert "mail-1" not in sys.modules["review_handlers"].SENT


# -- 3. a NUL byte in an error message ---------------------------------------------------------


def test_a_nul_byte_in_a_handler_error_is_stored_escaped_and_the_task_retried(
        conn, db_dsn, make_worker, events):
    config = review_config(db_dsn, {"nul": "review_handlers:nul_error"})
    worker = make_worker(config)
    add_task(conn, "n1", "nul", max_retries=1)

    first = worker.run_once()

    assert first.name == "retried", first
    stored = task_row(conn, "n1")
    assert (stored["status"], stored["retry_count"], stored["claimed_by"]) == \
        ("PENDING", 1, None), stored
    assert "ValueError: bad record: b'\\x00abc' in row 7" in stored["error_message"], stored
    assert "\x00" not in stored["error_message"]
    assert len(events.of("task_retry_scheduled")) == 1

    second = worker.run_once()

    assert second.name == "failed", second
    stored = task_row(conn, "n1")
    assert (stored["status"], stored["retry_count"]) == ("FAILED", 1), stored
    assert "b'\\x00abc'" in stored["error_message"]
    assert events.of("task_failed")[0]["error"] == "ValueError: bad record: b'\\x00abc' in row 7"


def test_a_nul_byte_in_a_permanent_error_is_stored_escaped(conn, db_dsn, make_worker):
    config = review_config(db_dsn, {"nul": "review_handlers:nul_permanent"})
    worker = make_worker(config)
    add_task(conn, "p1", "nul", max_retries=3)

    assert worker.run_once().name == "failed"
    stored = task_row(conn, "p1")
    assert (stored["status"], stored["retry_count"]) == ("FAILED", 0), stored
    assert stored["error_message"] == "PermanentError: bad record: b'\\x00abc' in row 7"


def test_a_lone_surrogate_in_a_handler_error_does_not_leave_the_task_running(
        conn, db_dsn, make_worker):
    config = review_config(db_dsn, {"surrogate": "review_handlers:surrogate_error"})
    worker = make_worker(config)
    add_task(conn, "s1", "surrogate", max_retries=1)

    outcome = worker.run_once()

    assert outcome.name == "retried", outcome
    stored = task_row(conn, "s1")
    assert (stored["status"], stored["retry_count"]) == ("PENDING", 1), stored


# -- 4. a password quoted by a DSN parse error ----------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# libpq refuses each of these while parsing, quoting the token it could not decode.
MALFORMED = [
    ("postgresql://app:S3cr%t!pw@127.0.0.1:{port}/db", ["S3cr%t!pw", "S3cr", "t!pw"]),
    ("postgresql://app:p%zzword@127.0.0.1:{port}/db", ["p%zzword", "zzword"]),
    ("postgresql://app@127.0.0.1:{port}/db?password=S3cr%t!pw", ["S3cr%t!pw", "S3cr", "t!pw"]),
]


@pytest.mark.parametrize("template, secrets", MALFORMED)
def test_a_connection_failure_never_quotes_a_malformed_password(template, secrets):
    dsn = template.format(port=free_port())
    with pytest.raises(OperationalError) as caught:
        connect(dsn, connect_timeout=1)
    message = str(caught.value)
    assert message.startswith("cannot connect to PostgreSQL"), message
    for secret in secrets:
        assert secret not in message, message


def test_the_cli_prints_no_malformed_password_on_stderr():
    dsn = f"postgresql://app:S3cr%t!pw@127.0.0.1:{free_port()}/db"
    env = {k: v for k, v in os.environ.items() if k not in ("PGTASKD_DSN", "PGTASKD_CONFIG")}
    env["PGTASKD_DSN"] = dsn
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "stats"], env=env,
                            capture_output=True, text=True, timeout=60)
    # libpq cannot read this DSN at all: bad input (exit 2), found before connecting.
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "PGTASKD_DSN: not a valid connection string" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    for secret in ("S3cr", "t!pw"):
        assert secret not in result.stderr and secret not in result.stdout, result.stderr


# -- 9. a connection that stops relaying --------------------------------------------------------


LEASE = 3.0


def proxy_to(dsn: str) -> TcpProxy:
    target = conninfo_to_dict(dsn)
    return TcpProxy(target.get("host") or "127.0.0.1", int(target.get("port") or 5432))


def via(dsn: str, proxy: TcpProxy) -> str:
    return make_conninfo(dsn, host="127.0.0.1", port=str(proxy.port))


def stalling_handler(proxy: TcpProxy | None, seen: dict):
    """A cooperative handler: it freezes the proxy (if given) as it starts, then works until
    is_cancelled() turns true (30 s at most), noting when, and stops at that safe point."""

    def handler(task):
        if proxy is not None:
            proxy.freeze()  # the network goes dark right after the claim
        seen["frozen"] = time.monotonic()
        deadline = seen["frozen"] + 30
        while time.monotonic() < deadline and not task.is_cancelled():
            time.sleep(0.02)
        seen["stopped"] = time.monotonic()
        seen["reason"] = task.cancel_reason
        task.raise_if_cancelled()

    return handler


def test_a_stalled_connection_cannot_hide_a_lost_lease_nor_hang_the_worker(
        conn, db_dsn, make_worker, events):
    """The path to PostgreSQL stops relaying while a cooperative handler runs (the sockets stay
    open: no error ever reaches the lease thread, whose renewal just hangs). By the worker's
    own clock the lease is gone after lease.seconds, and the handler must be told. Once the
    path takes new connections again, the run must end, though the stalled connection never
    answers."""
    with proxy_to(db_dsn) as proxy:
        proxy_dsn = via(db_dsn, proxy)
        config = make_config(proxy_dsn, lease={"seconds": LEASE, "renew_interval": 1.0},
                             database={"connect_timeout": 1})
        seen: dict = {}
        worker = make_worker(config, handlers={"stalled": stalling_handler(proxy, seen)},
                             dsn=proxy_dsn)
        add_task(conn, "t1", "stalled", max_retries=3)
        outcome = []
        runner = threading.Thread(target=lambda: outcome.append(worker.run_once()), daemon=True)
        started = time.monotonic()
        runner.start()
        try:
            wait_until(lambda: "stopped" in seen, timeout=LEASE + 10,
                       message="the handler to see the task as no longer its own")
            by_the_clock = seen["stopped"] - started
            measure = (f"is_cancelled() turned true {by_the_clock:.2f} s after run_once began "
                       f"(lease {LEASE:g} s), {seen['stopped'] - seen['frozen']:.2f} s after "
                       f"the freeze")
            print(measure)
            assert by_the_clock <= LEASE + 1.0, measure
            assert seen["stopped"] - seen["frozen"] >= LEASE - 1.0, measure
            assert "lease expired" in (seen["reason"] or ""), seen
            # Nobody could have renewed: the database still shows the expired lease.
            assert task_row(conn, "t1")["status"] == "RUNNING"

            # New connections get through again; the stalled one never answers.
            proxy.thaw(existing=False)
            runner.join(20)
            assert not runner.is_alive(), \
                "the worker hangs after its handler stopped (waiting for the stalled renewal?)"
        finally:
            proxy.thaw()  # whatever happened, let the run end before the proxy closes
            runner.join(30)

    # Nobody took the task over, so the interrupted run counts as a failed attempt.
    assert outcome[0].name == "retried", outcome
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["retry_count"], stored["claimed_by"]) == \
        ("PENDING", 1, None), stored
    assert "lease expired before a renewal got through" in stored["error_message"]
    assert not events.of("task_completed")


# A daemon's child opens its pool as worker/main.py does (open_pool) and has its leases renewed
# by the supervisor, whose keeper uses a connection of its own. A connection may stall without
# any TCP error (the peer's kernel still ACKs: a stalled server or middlebox; keepalives and
# tcp_user_timeout never fire then): every statement the loop and the keeper send has a read
# deadline (supervisor/db/deadline.py), past which the connection is cut and the statement
# retried on another.


def test_with_the_daemons_pool_a_stalled_connection_does_not_hang_the_worker(conn, db_dsn):
    from supervisor.worker.loop import STATEMENT_DEADLINE
    from supervisor.worker.pools import open_pool

    with proxy_to(db_dsn) as proxy:
        proxy_dsn = via(db_dsn, proxy)
        config = make_config(proxy_dsn, lease={"seconds": LEASE, "renew_interval": 1.0},
                             database={"connect_timeout": 1})
        seen: dict = {}
        pool = open_pool(proxy_dsn, connect_timeout=1, name="pgtaskd default#1")
        pool.open(wait=True, timeout=10)
        worker = Worker(config, pool=pool, worker_id="worker-1",
                        handlers={"stalled": stalling_handler(proxy, seen)})
        add_task(conn, "t1", "stalled", max_retries=3)
        runner = threading.Thread(target=worker.run_once, daemon=True)
        runner.start()
        try:
            wait_until(lambda: "stopped" in seen, timeout=LEASE + 10,
                       message="the handler to see the task as no longer its own")
            proxy.thaw(existing=False)
            runner.join(STATEMENT_DEADLINE + 10)
            assert not runner.is_alive(), "the run never ends: its final write waits on the " \
                                          "claim's stalled connection"
        finally:
            proxy.thaw()  # the stalled connections answer at last: the run ends
            runner.join(30)
            worker.leases.stop()
            pool.close()
    stored = task_row(conn, "t1")
    assert (stored["status"], stored["retry_count"]) == ("PENDING", 1), stored


def test_after_a_stalled_renewal_the_next_task_can_still_renew_its_lease(conn, db_dsn):
    from supervisor.worker.leases import LocalLeases
    from supervisor.worker.pools import open_pool

    with proxy_to(db_dsn) as proxy:
        # Only the renewals go through the proxy: the loop's pool goes straight to PostgreSQL.
        config = make_config(db_dsn, lease={"seconds": LEASE, "renew_interval": 1.0},
                             database={"connect_timeout": 1})
        first: dict = {}
        second: dict = {}
        pool = open_pool(db_dsn, connect_timeout=1, name="pgtaskd default#1")
        pool.open(wait=True, timeout=10)
        handlers = {"stalled": stalling_handler(proxy, first),
                    "long": lambda task: second.setdefault("cancelled", _runs_past_lease(task))}
        worker = Worker(config, pool=pool, worker_id="worker-1", handlers=handlers,
                        leases=lambda w: LocalLeases(via(db_dsn, proxy), config, w,
                                                     worker_id="worker-1", pool_name="default"))
        try:
            add_task(conn, "t1", "stalled", max_retries=0)  # not to be claimed again below
            assert worker.run_once().name == "failed"
            proxy.thaw(existing=False)  # the path is back; the stalled renewal is still stuck

            add_task(conn, "t2", "long", max_retries=3)
            outcome = worker.run_once()
            assert second["cancelled"] is False, \
                "the next task lost its lease while the database was reachable"
            assert outcome.name == "completed", outcome
        finally:
            proxy.thaw()
            worker.leases.stop()
            pool.close()


def _runs_past_lease(task) -> bool:
    """Work for twice the lease, renewals permitting; True if told to stop."""
    deadline = time.monotonic() + 2 * LEASE
    while time.monotonic() < deadline:
        if task.is_cancelled():
            return True
        time.sleep(0.02)
    return False
