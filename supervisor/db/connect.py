"""Opening connections, and naming the server in errors without its password."""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ..errors import OperationalError
from .redact import MISREAD_HINT, doubtful, hide_secrets, misread_uri, redact_dsn


def describe_target(dsn: str) -> str:
    """``host:port/dbname`` of a DSN, for error messages; the DSN redacted when libpq reads
    it otherwise than it is written (those names may be pieces of the password)."""
    if doubtful(dsn):
        return redact_dsn(dsn)
    parts = conninfo_to_dict(dsn)
    host = parts.get("host") or parts.get("hostaddr") or "localhost"
    port = parts.get("port") or "5432"
    dbname = parts.get("dbname") or parts.get("user")
    return f"{host}:{port}/{dbname}" if dbname else f"{host}:{port}"


def connection_failure(dsn: str, exc: BaseException) -> OperationalError:
    """One line naming the server and why it could not be reached, password-free.

    libpq's message ends with tab-indented hints ("Is the server running...?"); the reason
    is the text after the last "failed: " of the last unindented line.
    """
    lines = [line for line in str(exc).splitlines() if line.strip() and not line.startswith("\t")]
    reason = lines[-1] if lines else type(exc).__name__
    if "failed: " in reason:
        reason = reason.rsplit("failed: ", 1)[1]
    reason = " ".join(reason.split())
    if dsn:
        reason = hide_secrets(reason, dsn) + (MISREAD_HINT if misread_uri(dsn) else "")
    return OperationalError(f"cannot connect to PostgreSQL at {describe_target(dsn)}: {reason}")


# Notice a dead network path within seconds instead of the kernel's ~15 minutes: a worker
# whose connection stalled silently (a partition, a failover) must find out before its lease
# runs out, and the supervisor's loop must not hang on one. libpq ignores these for unix
# sockets. A DSN that sets any of them itself keeps its own values.
TCP_OPTIONS = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
               "keepalives_count": 3, "tcp_user_timeout": 10_000}


def with_options(dsn: str, **options) -> str:
    """The DSN with libpq options added (application_name, connect_timeout, ...) and the
    TCP timeouts above, unless the DSN chose its own."""
    try:
        own = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        own = {}
    merged = {k: v for k, v in TCP_OPTIONS.items() if k not in own}
    merged.update({k: v for k, v in options.items() if v is not None})
    return make_conninfo(dsn, **merged)


def worker_application_name(worker_id: str) -> str:
    """The application_name of a worker child's connections. A child killed while its claim
    statement runs leaves the statement running in its backend, which may commit after the
    supervisor looked for the child's claims; the supervisor finds such statements by this
    name. Printable ASCII of at most 63 bytes, so that PostgreSQL keeps it as given and an
    equality finds it."""
    name = "pgtaskd " + worker_id
    return "".join(c if " " <= c <= "~" else "?" for c in name)[:63]


def connect(dsn: str, *, autocommit: bool = True, connect_timeout: float = 5.0,
            application_name: str = "pgtaskd", pooled: bool = False) -> psycopg.Connection:
    """A plain connection, or an OperationalError that names the server and the reason.

    ``pooled``: the DSN goes through a pooler in transaction mode (PgBouncer's
    pool_mode=transaction), which hands each transaction to whichever server connection is
    free: a statement prepared on one would be missing on the next, so none is prepared.
    """
    try:
        conn = psycopg.connect(
            with_options(dsn, connect_timeout=max(1, int(connect_timeout)),
                         application_name=application_name),
            autocommit=autocommit,
        )
    except psycopg.Error as exc:
        raise connection_failure(dsn, exc) from None
    if pooled:
        conn.prepare_threshold = None
    return conn


SUPERVISOR_LOCK_TIMEOUT = 2.0
SUPERVISOR_STATEMENT_TIMEOUT = 10.0


class LazyConnection:
    """One autocommit connection for one thread: opened on first use, reopened after it
    broke. For the supervisor's threads, which each need a single connection and must
    survive a database restart."""

    def __init__(self, dsn: str, *, connect_timeout: float, application_name: str,
                 pooled: bool = False):
        self.dsn = dsn
        self.connect_timeout = connect_timeout
        self.application_name = application_name
        self.pooled = pooled
        self._conn: psycopg.Connection | None = None

    def get(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            conn = connect(self.dsn, connect_timeout=self.connect_timeout,
                           application_name=self.application_name, pooled=self.pooled)
            if self.pooled:
                # Session settings would leak to other clients of the pooler's server
                # connection; the read deadline (db/deadline.py) bounds every statement.
                self._conn = conn
                return conn
            try:
                # The supervisor's statements are short; one stuck behind a row lock (an
                # operator's SELECT ... FOR UPDATE) must fail and be retried later rather
                # than hold up renewals or the reaper.
                conn.execute(f"SET lock_timeout = {int(SUPERVISOR_LOCK_TIMEOUT * 1000)}")
                conn.execute(f"SET statement_timeout = {int(SUPERVISOR_STATEMENT_TIMEOUT * 1000)}")
                # Short statements with rough estimates: JIT compilation only adds time.
                conn.execute("SET jit = off")
            except psycopg.Error as exc:
                conn.close()
                raise connection_failure(self.dsn, exc) from None
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None
