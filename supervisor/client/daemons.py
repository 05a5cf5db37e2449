"""The daemon registry as the client reads it: which daemons run on this database, what each
of their children runs, and which went silent (maintenance/registry.py writes it)."""

from __future__ import annotations

from typing import Any

from ..config import REGISTRY_LOST_BEATS, REGISTRY_LOST_FLOOR
from ..db import store
from ..errors import UsageError, quote
from ..task_fields import check_int

DAEMON_STATES = ("starting", "running", "reloading", "stopping", "stopped", "lost")
DEFAULT_DAEMONS_LIMIT = 100
MAX_DAEMONS_LIMIT = 10_000


def check_daemon_state(state: Any) -> str:
    """A lower-cased daemon state, or UsageError naming the states there are."""
    if not isinstance(state, str) or state.lower() not in DAEMON_STATES:
        raise UsageError(f"state: unknown daemon state {quote(state)} "
                         f"(one of: {', '.join(DAEMON_STATES)})")
    return state.lower()


class Daemons:
    """The client's view of the registry; ``ClientConnection`` provides the connection."""

    def daemons(self, state: str | None = None,
                limit: int = DEFAULT_DAEMONS_LIMIT) -> list[dict[str, Any]]:
        """The daemons on this database, those that run first (by host and config, newest
        run first), then the stopped and lost ones; only those in ``state`` if given.

        Each is ``{"id", "daemon", "host", "pid", "version", "config_path", "started_at",
        "heartbeat_at", "heartbeat_interval", "generation", "state", "reported_state",
        "silent_seconds", "pools"}``. ``daemon`` is its host and config file (as in limit
        claims); ``id`` tells two runs of it apart. ``state`` is ``starting``, ``running``,
        ``reloading``, ``stopping``, ``stopped`` (it signed off) or ``lost``: its heartbeat
        is older than three of its intervals (and 10 s) by the database's clock, and
        ``reported_state`` is what it said last. ``pools`` maps each pool to its children:
        ``{"slot", "pid", "generation", "state" (booting, idle, working, stopping),
        "stopping" (why), "held" (claims it holds), "tasks": [{"id", "type", "state"
        (claimed, running, finished)}]}``, at most 10 tasks each, the running ones first.
        What a daemon wrote is at most its heartbeat interval (and a second) old.
        Rows of daemons silent for a day are deleted.
        """
        state = None if state is None else check_daemon_state(state)
        limit = check_int("limit", limit, 1, MAX_DAEMONS_LIMIT)
        with self._database() as conn:
            return store.list_daemons(conn, state=state, limit=limit,
                                      lost_beats=REGISTRY_LOST_BEATS,
                                      lost_floor=REGISTRY_LOST_FLOOR)
