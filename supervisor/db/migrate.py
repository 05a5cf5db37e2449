"""Versioned schema migrations: each applied once, however many daemons start at once, without
blocking a live table's writers, and never run against by a daemon too old for the schema.

Index builds on ``tasks`` are written ``CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS``:
a plain build holds a lock that stops every INSERT and UPDATE of the table for as long as it
reads the table, minutes on a big one, while the daemons of the old version keep running. A
concurrent build cannot run in a transaction, so a migration is cut into steps: each such
build alone, each stretch of other statements in a transaction of its own. The steps done are
recorded, so a migration cut short (a crash, a failed build) resumes where it stopped; a build
that failed midway leaves an INVALID index, which is dropped and built again.

Two migrators take turns on a session advisory lock, asked for with ``pg_try_advisory_lock``
and retried, never waited for inside the server: a concurrent build waits for every
transaction older than itself, a blocked ``pg_advisory_lock`` call is one, and the two would
deadlock.

A migration that a daemon of the previous version can run against (it adds what the old code
never reads) says so on a line of its own: ``-- pgtaskd: older daemons may run on this``.
Any other migration a daemon does not know stops it: at start it refuses, and a running one
finds out from its health check and shuts down (see ``newer_schema``). A daemon that claimed
against a schema it does not know could skip a rule the new schema adds (a limit's slots).
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from importlib import resources

import psycopg

from ..errors import MigrationError

# An arbitrary constant shared by every pgtaskd process: "pgtaskd" read as ASCII digits.
MIGRATION_LOCK_KEY = 7_071_164_753_107_100
LOCK_RETRY_SECONDS = 0.2

_FILE_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")
_COMPATIBLE = re.compile(r"^-- pgtaskd: older daemons may run on this\s*$", re.MULTILINE)
# A concurrent build: from the start of a line to the first line that ends with ";".
_CONCURRENT_BUILD = re.compile(
    r"^CREATE (?:UNIQUE )?INDEX CONCURRENTLY IF NOT EXISTS (\w+)\b.*?;[ \t]*$",
    re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    older_daemons_ok: bool = False
    # ("sql", text) run in a transaction, or ("index", name, statement) run alone.
    steps: tuple = field(default=(), compare=False)

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


def split_steps(sql: str) -> tuple:
    steps, start = [], 0
    for match in _CONCURRENT_BUILD.finditer(sql):
        before = sql[start:match.start()]
        if _has_statements(before):
            steps.append(("sql", before))
        steps.append(("index", match[1], match[0]))
        start = match.end()
    rest = sql[start:]
    if _has_statements(rest) or not steps:
        steps.append(("sql", rest))
    return tuple(steps)


def _has_statements(sql: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in sql.splitlines())


def available_migrations() -> list[Migration]:
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            sql = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match[1]), match[2], sql,
                                   older_daemons_ok=bool(_COMPATIBLE.search(sql)),
                                   steps=split_steps(sql)))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version number: {versions}")
    return found


@functools.cache
def latest_known_version() -> int:
    return max(m.version for m in available_migrations())


def migrate(conn: psycopg.Connection, *, through: int | None = None,
            pooled: bool = False) -> list[Migration]:
    """Apply every migration not yet applied (up to version ``through``); return those
    applied. Then refuse a schema newer than this code (MigrationError).

    ``pooled``: the connection goes through a transaction pooler, which would hand a session
    lock and the steps to different server connections: everything runs in one transaction
    as plain builds, which block the table's writers while they run (the README says to
    migrate through a direct connection)."""
    if pooled:
        return _migrate_in_one_transaction(conn, through)
    if not conn.autocommit:
        raise RuntimeError("migrate() needs an autocommit connection")
    _take_lock(conn)
    try:
        applied_now = []
        for migration in _to_apply(conn, through):
            _apply_in_steps(conn, migration)
            applied_now.append(migration)
        refuse_newer_schema(conn)
        return applied_now
    finally:
        try:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        except psycopg.Error:
            pass  # a lost connection took its session lock with it


def _take_lock(conn: psycopg.Connection) -> None:
    while not conn.execute("SELECT pg_try_advisory_lock(%s)",
                           (MIGRATION_LOCK_KEY,)).fetchone()[0]:
        time.sleep(LOCK_RETRY_SECONDS)


def _create_bookkeeping(conn: psycopg.Connection) -> None:
    """In the transaction of a migration's step: one that fails leaves nothing behind."""
    if conn.execute("SELECT to_regclass('pgtaskd_migration_progress') IS NOT NULL").fetchone()[0]:
        return
    with conn.transaction():
        conn.execute(
            """CREATE TABLE IF NOT EXISTS pgtaskd_schema_migrations (
                   version INTEGER PRIMARY KEY,
                   name TEXT NOT NULL,
                   applied_at TIMESTAMPTZ NOT NULL DEFAULT now())""")
        conn.execute("ALTER TABLE pgtaskd_schema_migrations ADD COLUMN IF NOT EXISTS "
                     "older_daemons_ok BOOLEAN NOT NULL DEFAULT false")
        # The steps of a migration cut short; its row goes when the migration is recorded.
        conn.execute(
            """CREATE TABLE IF NOT EXISTS pgtaskd_migration_progress (
                   version INTEGER PRIMARY KEY,
                   steps_done INTEGER NOT NULL)""")


def _to_apply(conn: psycopg.Connection, through: int | None) -> list[Migration]:
    return [m for m in pending_migrations(conn) if through is None or m.version <= through]


def _apply_in_steps(conn: psycopg.Connection, migration: Migration) -> None:
    row = None
    if conn.execute("SELECT to_regclass('pgtaskd_migration_progress') IS NOT NULL").fetchone()[0]:
        row = conn.execute("SELECT steps_done FROM pgtaskd_migration_progress "
                           "WHERE version = %s", (migration.version,)).fetchone()
    done = row[0] if row else 0
    last = len(migration.steps) - 1
    for number, step in enumerate(migration.steps):
        if number < done:
            continue
        try:
            if step[0] == "index":
                _build_index(conn, step[1], step[2])
            with conn.transaction():
                if step[0] == "sql":
                    conn.execute(step[1])
                _create_bookkeeping(conn)
                if number == last:
                    conn.execute("DELETE FROM pgtaskd_migration_progress WHERE version = %s",
                                 (migration.version,))
                    conn.execute("INSERT INTO pgtaskd_schema_migrations "
                                 "(version, name, older_daemons_ok) VALUES (%s, %s, %s)",
                                 (migration.version, migration.name,
                                  migration.older_daemons_ok))
                else:
                    conn.execute(
                        "INSERT INTO pgtaskd_migration_progress (version, steps_done) "
                        "VALUES (%s, %s) ON CONFLICT (version) "
                        "DO UPDATE SET steps_done = EXCLUDED.steps_done",
                        (migration.version, number + 1))
        except (psycopg.ProgrammingError, psycopg.DataError, psycopg.IntegrityError) as exc:
            raise _failed(migration, exc) from None


def _build_index(conn: psycopg.Connection, name: str, statement: str) -> None:
    valid = conn.execute(
        "SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
        (name,)).fetchone()
    if valid is not None and not valid[0]:
        # What a build cut short leaves: IF NOT EXISTS would keep it, and it serves nothing.
        conn.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
    conn.execute(statement)


def _migrate_in_one_transaction(conn: psycopg.Connection, through: int | None) -> list:
    applied_now = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        _create_bookkeeping(conn)
        for migration in _to_apply(conn, through):
            sql = migration.sql.replace(" INDEX CONCURRENTLY IF NOT EXISTS ", " INDEX ")
            try:
                conn.execute(sql)
            except (psycopg.ProgrammingError, psycopg.DataError, psycopg.IntegrityError) as exc:
                raise _failed(migration, exc) from None
            conn.execute("INSERT INTO pgtaskd_schema_migrations (version, name, "
                         "older_daemons_ok) VALUES (%s, %s, %s)",
                         (migration.version, migration.name, migration.older_daemons_ok))
            applied_now.append(migration)
        refuse_newer_schema(conn)
    return applied_now


def _failed(migration: Migration, exc: BaseException) -> MigrationError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
    return MigrationError(f"migration {migration.label} failed: {first}")


def newer_schema(conn: psycopg.Connection) -> str | None:
    """Why this code must not claim against the database's schema, or None: a migration it
    does not know that older daemons may not run on. One small read of a small table."""
    known = latest_known_version()
    try:
        # Any version this code lacks, not only a higher one: a number skipped here (0008
        # was never released) and filled by another build is as unknown as a newer one.
        # to_jsonb: the flag column is missing where only an older pgtaskd ever migrated.
        row = conn.execute(
            "SELECT version, name FROM pgtaskd_schema_migrations m "
            "WHERE NOT version = ANY(%s::int[]) "
            "AND NOT coalesce((to_jsonb(m) ->> 'older_daemons_ok')::boolean, false) "
            "ORDER BY version LIMIT 1",
            ([m.version for m in available_migrations()],)).fetchone()
    except psycopg.errors.UndefinedTable:
        return None  # never migrated: the claims' own errors say so
    if row is None:
        return None
    return (f"the database's schema has migration {row[0]:04d}_{row[1]}, newer than this "
            f"pgtaskd knows ({known:04d}), and daemons before it must not claim tasks: "
            f"upgrade pgtaskd on this host")


def refuse_newer_schema(conn: psycopg.Connection) -> None:
    reason = newer_schema(conn)
    if reason:
        raise MigrationError(reason)


def pending_migrations(conn: psycopg.Connection) -> list[Migration]:
    """Migrations the database still lacks (for health checks and ``check-config``)."""
    exists = conn.execute("SELECT to_regclass('pgtaskd_schema_migrations') IS NOT NULL").fetchone()[0]
    done = set()
    if exists:
        done = {row[0] for row in conn.execute("SELECT version FROM pgtaskd_schema_migrations")}
    return [m for m in available_migrations() if m.version not in done]
