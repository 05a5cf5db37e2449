"""The client's connection: a DSN it owns, or a psycopg connection it borrows.

An owned connection is opened on first use and reopened if it broke; a borrowed one is used as
it is, inside whatever transaction it has open, and never committed, rolled back or closed.
Every call reaches the database through ``_database()``, which turns psycopg's errors into
one-line OperationalErrors.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Self

import psycopg

from ..config import Config, load_config
from ..db.connect import connect, describe_target
from ..db.session import database_dsn
from ..errors import OperationalError
from ..task_fields import DEFAULT_MAX_PAYLOAD_BYTES

DEFAULT_CONNECT_TIMEOUT = 5.0


class ClientConnection:
    """What every client call runs on: one connection, owned or borrowed, and the settings
    the client was made with."""

    def __init__(self, target: str | psycopg.Connection, *,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 transaction_pooler: bool = False):
        """``target`` is a DSN (the client owns a connection) or a psycopg connection
        (borrowed: calls join its transaction; it is never committed or closed here).
        ``transaction_pooler``: the DSN goes through PgBouncer in transaction mode, so the
        client's connection prepares no statement."""
        if isinstance(target, psycopg.Connection):
            self._setup(dsn=None, conn=target, config=None, max_payload_bytes=max_payload_bytes,
                        connect_timeout=connect_timeout, pooled=transaction_pooler)
        elif isinstance(target, str) and target:
            self._setup(dsn=target, conn=None, config=None, max_payload_bytes=max_payload_bytes,
                        connect_timeout=connect_timeout, pooled=transaction_pooler)
        else:
            raise TypeError(f"Client needs a DSN or a psycopg connection, got {target!r}")

    @classmethod
    def from_config(cls, config: str | os.PathLike | Config | None = None) -> Self:
        """A client for the database of a pgtaskd config (a path, or None for $PGTASKD_CONFIG).

        Without a DSN there, the embedded PostgreSQL in ``database.data_dir`` is started on
        first use and held until ``close()``.
        """
        if not isinstance(config, Config):
            config = load_config(config)
        client = cls.__new__(cls)
        client._setup(dsn=config.database.dsn, conn=None, config=config,
                      max_payload_bytes=config.max_payload_bytes,
                      connect_timeout=config.database.connect_timeout,
                      pooled=config.database.transaction_pooler)
        return client

    def _setup(self, *, dsn: str | None, conn: psycopg.Connection | None,
               config: Config | None, max_payload_bytes: int, connect_timeout: float,
               pooled: bool) -> None:
        self.max_payload_bytes = max_payload_bytes
        self.connect_timeout = connect_timeout
        self._pooled = pooled
        self._dsn = dsn
        self._conn = conn
        self._owns_connection = conn is None
        # Set by from_config(); without a DSN there, it says where to start the embedded server.
        self._config = config
        self._resources = contextlib.ExitStack()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Close an owned connection and let go of the embedded server; a borrowed one stays."""
        if self._owns_connection and self._conn is not None:
            self._conn.close()
            self._conn = None
        self._resources.close()
        if self._config is not None and not self._config.database.dsn:
            self._dsn = None  # the embedded server's address dies with it

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Make the calls inside one atomic unit: all of them take effect, or none.

        psycopg's ``Connection.transaction()``: a savepoint when the connection already has a
        transaction open (a borrowed one usually does), else a transaction of its own that
        commits when the block ends and rolls back if it raises.
        """
        with self._database() as conn, conn.transaction():
            yield

    def _connection(self) -> psycopg.Connection:
        if not self._owns_connection:
            return self._conn
        if self._conn is None or self._conn.closed:
            if self._dsn is None:
                self._dsn = self._resources.enter_context(database_dsn(self._config))
            self._conn = connect(self._dsn, connect_timeout=self.connect_timeout,
                                 application_name="pgtaskd client", pooled=self._pooled)
        return self._conn

    def _target(self, conn: psycopg.Connection) -> str:
        if self._dsn:
            return describe_target(self._dsn)
        return f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}"

    @contextlib.contextmanager
    def _database(self) -> Iterator[psycopg.Connection]:
        """The connection, with psycopg's errors turned into one-line OperationalErrors."""
        conn = self._connection()
        try:
            yield conn
        except psycopg.errors.UndefinedTable as exc:
            raise OperationalError(f"PostgreSQL at {self._target(conn)} has no pgtaskd schema: "
                                   f"run 'pgtaskd migrate' first") from exc
        except psycopg.Error as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            what = "lost the connection to" if conn.closed else "error from"
            raise OperationalError(f"{what} PostgreSQL at {self._target(conn)}: {reason}") from exc
