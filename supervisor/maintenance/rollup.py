"""The minute rollup: once a minute, the queue's figures of the minute that just ended, one
row per task type, for the web console's charts and its 24-hour and one-hour counts, which
then never read the tasks table for them.

Every daemon runs it; the rows of a minute are the same whoever writes them first, and the
others' inserts change nothing (rollup_minutes in queries.sql). One statement a minute, timed
by the database's clock: each pass learns how far into the minute it ran, and waits for the
next minute's end plus a little, so that the completions of the last instant are in.
A minute missed while no daemon ran is rolled up later from the finished tasks (its queue
depth, which nobody saw, stays unknown) for up to CATCH_UP minutes back.
"""

from __future__ import annotations

from ..db import queue_figures, store
from ..logs import emit
from .service import PeriodicService

INTERVAL = 60.0
# Seconds past the end of a minute before it is rolled up: a completion's finished_at is its
# transaction's start, which commits a moment later.
SETTLE = 2.0
CATCH_UP = 10
MAX_TYPES = 200


class MinuteRollup(PeriodicService):
    name_prefix = "rollup"

    def __init__(self, dsn: str, *, connect_timeout: float = 5.0, pooled: bool = False):
        super().__init__(dsn, INTERVAL, connect_timeout=connect_timeout, pooled=pooled)
        self._wait = INTERVAL
        self._passes = 0

    def run_once(self) -> dict:
        """Roll up the minutes that ended and nobody rolled up: {minutes_written,
        into_minute}."""
        result = store.rollup_minutes(self.connection(), cap=queue_figures.COUNT_CAP,
                                      catch_up=CATCH_UP, max_types=MAX_TYPES)
        self._wait = max(1.0, INTERVAL + SETTLE - result["into_minute"])
        # The first pass of a daemon fills what was missed before it started, as expected;
        # a later one that writes several minutes found a gap while this daemon ran.
        if result["minutes_written"] > 1 and self._passes:
            emit("rollup_caught_up", minutes=result["minutes_written"])
        self._passes += 1
        return result

    def next_wait(self) -> float:
        return self._wait

    def on_failure(self, exc: BaseException) -> None:
        self._wait = INTERVAL
