"""Each child's claim states, in memory the child writes and the supervisor reads.

The supervisor must know the state of every claim a child holds (claimed, waiting in a
batch; started, its handler runs; finished, the handler succeeded but the completion is not
written yet) so that a child that dies is settled exactly: a finished run completed, the run
it was in charged an attempt, the claims it never started given back free. The child says
what it claimed over its link (the lease keeper needs that to renew), but a message at every
handler start and end would wake the supervisor twice per task: on a batch drain that cost a
sixth of the throughput. So the child also writes each claim's state into a small table of
shared memory (a memfd the supervisor creates and passes down, like the link), and the
supervisor reads it when the child is gone, and at most once a second while it lives, for the
registry's snapshot of which task each child runs (daemon/snapshot.py).

Each slot is one aligned 8-byte word, ``token << 2 | state``, written by a single store: a
child killed at any instant leaves every slot as it was before or after a write, never torn,
so what the supervisor reads is what the child last said.
"""

from __future__ import annotations

import mmap
import os

EMPTY, CLAIMED, STARTED, FINISHED = 0, 1, 2, 3
_WORD = 8


class ClaimBoard:
    def __init__(self, fd: int, slots: int):
        self.fd = fd
        self.slots = max(1, slots)
        self._map = mmap.mmap(fd, self.slots * _WORD)
        self._cells = memoryview(self._map).cast("q")

    @classmethod
    def create(cls, slots: int) -> "ClaimBoard":
        """A new, zeroed table for a child that holds at most ``slots`` claims at once."""
        fd = os.memfd_create("pgtaskd-claims", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, max(1, slots) * _WORD)
            return cls(fd, slots)
        except BaseException:
            os.close(fd)
            raise

    # -- the child's side ------------------------------------------------------------------

    def claimed(self, tokens: list[int]) -> None:
        """A new set of claims: slot i holds the i-th, the slots after them are emptied."""
        cells = self._cells
        for slot in range(self.slots):
            cells[slot] = tokens[slot] << 2 | CLAIMED if slot < len(tokens) else EMPTY

    def mark(self, slot: int, token: int, state: int) -> None:
        if 0 <= slot < self.slots:
            self._cells[slot] = token << 2 | state

    # -- the supervisor's side ---------------------------------------------------------------

    def states(self) -> dict[int, int]:
        """token -> state of every claim the child last wrote."""
        return {word >> 2: word & 3 for word in self._cells if word & 3 != EMPTY}

    def close(self) -> None:
        cells, self._cells = self._cells, None
        if cells is None:
            return
        cells.release()
        self._map.close()
        os.close(self.fd)


class NoBoard:
    """For a worker no supervisor watches (pgtaskd worker, the tests)."""
    slots = 0

    def claimed(self, tokens: list[int]) -> None:
        pass

    def mark(self, slot: int, token: int, state: int) -> None:
        pass
