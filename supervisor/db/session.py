"""Which PostgreSQL to use: the configured DSN, or the embedded server in ``data_dir``."""

from __future__ import annotations

import contextlib
from typing import Iterator

from ..config import Config
from .embedded import EmbeddedPostgres


@contextlib.contextmanager
def database_dsn(config: Config) -> Iterator[str]:
    """Yield a DSN; without one configured, run the embedded server for the duration."""
    if config.database.dsn:
        yield config.database.dsn
        return
    embedded = EmbeddedPostgres(config.database.data_dir)
    dsn = embedded.start()
    try:
        yield dsn
    finally:
        embedded.stop()
