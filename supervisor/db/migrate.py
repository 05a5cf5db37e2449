"""Versioned schema migrations, applied under an advisory lock.

Two daemons that start at once both call ``migrate``; the transaction-level advisory lock makes
the second wait for the first and then find nothing left to apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from ..errors import MigrationError

# An arbitrary constant shared by every pgtaskd process: "pgtaskd" read as ASCII digits.
MIGRATION_LOCK_KEY = 7_071_164_753_107_100

_FILE_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations() -> list[Migration]:
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version number: {versions}")
    return found


def migrate(conn: psycopg.Connection) -> list[Migration]:
    """Apply every migration not yet applied, in one transaction; return those applied."""
    applied_now = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(
            """CREATE TABLE IF NOT EXISTS pgtaskd_schema_migrations (
                   version INTEGER PRIMARY KEY,
                   name TEXT NOT NULL,
                   applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"""
        )
        done = {row[0] for row in conn.execute("SELECT version FROM pgtaskd_schema_migrations")}
        for migration in available_migrations():
            if migration.version in done:
                continue
            try:
                conn.execute(migration.sql)
            except (psycopg.ProgrammingError, psycopg.DataError, psycopg.IntegrityError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                raise MigrationError(f"migration {migration.version:04d}_{migration.name} "
                                     f"failed: {first}") from None
            conn.execute("INSERT INTO pgtaskd_schema_migrations (version, name) VALUES (%s, %s)",
                         (migration.version, migration.name))
            applied_now.append(migration)
    return applied_now


def pending_migrations(conn: psycopg.Connection) -> list[Migration]:
    """Migrations the database still lacks (for health checks and ``check-config``)."""
    exists = conn.execute("SELECT to_regclass('pgtaskd_schema_migrations') IS NOT NULL").fetchone()[0]
    done = set()
    if exists:
        done = {row[0] for row in conn.execute("SELECT version FROM pgtaskd_schema_migrations")}
    return [m for m in available_migrations() if m.version not in done]
