"""The daemon registry: each daemon's row in ``pgtaskd_daemons``, kept by a heartbeat.

Every ``registry.interval`` seconds (5 by default) the daemon writes what it is: host, pid,
version, config file, generation, state, and per pool its children with the tasks each
holds, in one UPSERT by primary key (a HOT update of one small row: see the README for its
measured cost). What it writes is the arbiter's latest DaemonSnapshot (daemon/snapshot.py),
which the arbiter's loop publishes without waiting on anything; a change of state or
generation wakes this thread, so a reload or a stop shows at once.

A daemon whose heartbeat is older than REGISTRY_LOST_BEATS of its intervals (by the
database's clock) shows as lost; that is decided when the registry is read, not written,
so a daemon killed with -9 needs nobody to mark it. On a clean stop the daemon signs off:
its row stays, as ``stopped``, so that an operator can tell a clean stop from a loss. Each
daemon deletes, once an hour, the rows of any daemon silent for REGISTRY_KEPT_SECONDS.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import psycopg

from .. import __version__
from ..config import REGISTRY_KEPT_SECONDS, Config
from ..db import store
from ..db.deadline import within
from ..errors import OperationalError, one_line
from ..logs import emit
from .service import PeriodicService

PRUNE_EVERY = 3600.0
# The sign-off is written while the daemon stops: it may not hold the stop up for long.
SIGN_OFF_DEADLINE = 2.0


@dataclass(frozen=True)
class DaemonIdentity:
    """Who writes the row: ``id`` is new for each run of the process; ``daemon`` is the
    host and config file, the name the daemons share in limit claims and schedule reports."""
    id: str
    daemon: str
    host: str
    pid: int
    version: str
    config_path: str | None

    @classmethod
    def of(cls, config: Config, daemon: str) -> "DaemonIdentity":
        return cls(id=str(uuid.uuid4()), daemon=daemon, host=socket.gethostname(),
                   pid=os.getpid(), version=__version__,
                   config_path=str(config.path.resolve()) if config.path else None)


class DaemonRegistry(PeriodicService):
    name_prefix = "registry"

    def __init__(self, dsn: str, *, interval: float, identity: DaemonIdentity,
                 snapshot: Callable, connect_timeout: float = 5.0, pooled: bool = False):
        """``snapshot()``: the arbiter's latest DaemonSnapshot."""
        super().__init__(dsn, interval, connect_timeout=connect_timeout, pooled=pooled)
        self.identity = identity
        self.snapshot = snapshot
        self._next_prune = 0.0  # monotonic; the first heartbeat prunes too
        self._beat_landed = False

    def run_once(self) -> dict:
        """One heartbeat, and a prune when one is due: what was written, and how many rows
        of silent daemons went."""
        snapshot = self.snapshot()
        me = self.identity
        conn = self.connection()
        self._beat_landed = False
        registered = store.heartbeat_daemon(
            conn, daemon_id=me.id, daemon=me.daemon, host=me.host, pid=me.pid,
            version=me.version, config_path=me.config_path, interval=self.interval,
            generation=snapshot.generation, state=snapshot.state, pools=snapshot.pools())
        self._beat_landed = True
        if registered:
            emit("daemon_registered", daemon_id=me.id, daemon=me.daemon,
                 heartbeat_interval=self.interval)
        pruned = 0
        if time.monotonic() >= self._next_prune:
            pruned = store.prune_daemons(conn, older_than_seconds=REGISTRY_KEPT_SECONDS)
            self._next_prune = time.monotonic() + PRUNE_EVERY
            if pruned:
                emit("daemons_pruned", rows=pruned, silent_seconds=REGISTRY_KEPT_SECONDS)
        return {"state": snapshot.state, "generation": snapshot.generation,
                "registered": registered, "pruned": pruned}

    def on_stop(self) -> None:
        """Sign off, if the database heard from us lately: a daemon that could not reach it
        shows as lost, which is what it was."""
        if not self._beat_landed:
            return
        try:
            conn = self.connection()
            with within(conn, SIGN_OFF_DEADLINE):
                store.sign_off_daemon(conn, self.identity.id)
        except (psycopg.Error, OperationalError) as exc:
            emit("registry_sign_off_failed", logging.WARNING, error=one_line(exc))
