"""The embedded default: a real PostgreSQL from the ``pgserver`` wheel, kept in ``data_dir``.

pgserver counts the processes holding a handle on one data directory and stops the server
when the last of them lets go, so ``pgtaskd submit`` can share the daemon's embedded server
without stopping it under the daemon's feet.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from ..errors import OperationalError


class EmbeddedPostgres:
    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self._server = None

    @property
    def dsn(self) -> str:
        if self._server is None:
            raise RuntimeError("the embedded PostgreSQL is not started")
        return self._server.get_uri()

    def start(self) -> str:
        """Start (or join) the server in ``data_dir`` and return its DSN."""
        # pgserver logs every pg_ctl call at INFO; our stderr is for pgtaskd's own events.
        logging.getLogger("pgserver").setLevel(logging.WARNING)
        try:
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset, as under systemd or cron.
                warnings.simplefilter("ignore")
                import pgserver
        except ImportError:
            raise OperationalError(
                "no database.dsn in the config and no PGTASKD_DSN set, and the embedded "
                "PostgreSQL is not installed: pip install 'pgtaskd[embedded]'") from None
        try:
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            self._server = pgserver.get_server(self.data_dir, cleanup_mode="stop")
        except Exception as exc:  # pgserver raises bare subprocess and assertion errors
            raise OperationalError(
                f"cannot start the embedded PostgreSQL in {self.data_dir}: {exc}") from None
        return self.dsn

    def stop(self) -> None:
        """Let go of the server; it stops when no other pgtaskd process holds it."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None
