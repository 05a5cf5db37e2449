"""Fold the metric files of dead worker children into one archive file per metric type.

prometheus_client's multiprocess mode gives each process its own files (counter_<pid>.db,
histogram_<pid>.db, ...) and every scrape reads them all. They outlive their process so that
counters never go backwards, which means a scrape grows with every child that ever lived: a
crash loop leaves thousands a day, and 5,000 of them made a scrape take 2.7 s.

Counters, histograms and summaries only ever add up across processes, so the values in a
reaped child's files are added, key by key, into counter_archive.db, histogram_archive.db and
summary_archive.db, and the child's files are deleted. The archives are written with
prometheus_client's own MmapedDict, and its MultiProcessCollector takes a file's type from the
name before the first "_", so it reads them like any other process's file. A scrape then reads
the live children's files and three archives, however many children died.

A fold writes the new archive beside the old one (a name a scrape never reads), then swaps it
in and deletes the folded files under ``lock``, which a scrape holds while it reads the
directory: a scrape sees each count exactly once, before or after the fold, never both or
neither. Gauges are left alone: the arbiter's mark_process_dead already drops a dead child's
live-mode gauges, and the other modes keep a per-pid meaning.

The folding runs on a thread of its own, never in the arbiter loop: the loop only reports a
reaped pid (child_died), and the thread folds the deaths of a burst together.
"""

from __future__ import annotations

import glob
import logging
import os
import struct
import threading
from typing import Callable, Iterable

from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from ..logs import emit

FOLDED_TYPES = ("counter", "histogram", "summary")
# Deaths in a crash loop or a reload come in bursts: wait this long after the first to fold
# them all at once.
BATCH_DELAY = 0.5
# After a failed fold (out of disk or descriptors), try again this much later.
RETRY_DELAY = 5.0


def archive_path(directory: str, kind: str) -> str:
    return os.path.join(directory, f"{kind}_archive.db")


def _read_values(path: str) -> list[tuple[str, float]]:
    """(key, value) of every entry in one of prometheus_client's files."""
    return [(entry[0], entry[1]) for entry in MmapedDict.read_all_values_from_file(path)]


def _write_values(path: str, totals: dict[str, float]) -> None:
    """A fresh file at ``path`` holding ``totals``, in prometheus_client's format."""
    try:
        os.unlink(path)  # MmapedDict would keep the entries of a failed earlier attempt
    except FileNotFoundError:
        pass
    values = MmapedDict(path)
    try:
        for key, value in totals.items():
            values.write_value(key, value, 0.0)  # the timestamp only matters to gauges
    finally:
        values.close()


class ArchiveCollector:
    """MultiProcessCollector's sum over the directory, read under the archive's lock."""

    def __init__(self, archive: "MetricsArchive"):
        self.archive = archive

    def collect(self):
        with self.archive.lock:
            # merge() reads every file before it returns: the lock covers the whole read.
            return MultiProcessCollector.merge(self.archive.files_to_read(), accumulate=True)


class MetricsArchive:
    def __init__(self, directory: str, *, live_pids: Callable[[], Iterable[int]] = tuple):
        self.directory = directory
        self.live_pids = live_pids
        self.lock = threading.Lock()
        """Held by a scrape while it reads the directory, and by a fold while it swaps files."""
        self._pending: set[int] = set()
        self._pending_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._failing = False
        self.thread = threading.Thread(target=self._run, name="metrics-archive", daemon=True)

    # -- what the arbiter and the scrape call -------------------------------------------------

    def child_died(self, pid: int) -> None:
        """A reaped child's pid, to fold soon. Cheap: the arbiter loop calls it."""
        with self._pending_lock:
            self._pending.add(pid)
        self._wake.set()

    def files_to_read(self) -> list[str]:
        """The files a scrape reads: every *.db file but those still empty. A child that
        just started creates its file and sizes it in two steps; reading it in between
        fails (prometheus_client's collector raises struct.error), and it holds nothing yet.
        """
        files = []
        for path in glob.glob(os.path.join(self.directory, "*.db")):
            try:
                if os.stat(path).st_size > 0:
                    files.append(path)
            except FileNotFoundError:
                pass  # a live gauge file mark_process_dead just removed
        return files

    # -- folding ------------------------------------------------------------------------------

    def fold(self, pids: Iterable[int]) -> int:
        """Add the counter, histogram and summary values of the dead ``pids`` into the
        archives and delete their files; how many files were folded.

        A pid that a live child uses again is skipped: its files now belong to that child
        (which carries on from their counts), and are folded when it dies. Raises OSError
        when a file cannot be read or written; nothing is deleted then, so nothing is lost.
        """
        live = set(self.live_pids())
        pids = [pid for pid in pids if pid not in live]
        folded = 0
        for kind in FOLDED_TYPES:
            dead = [path for path in (os.path.join(self.directory, f"{kind}_{pid}.db")
                                      for pid in pids) if os.path.exists(path)]
            if dead:
                folded += self._fold_files(kind, dead)
        return folded

    def _fold_files(self, kind: str, dead: list[str]) -> int:
        archive = archive_path(self.directory, kind)
        totals = dict(_read_values(archive)) if os.path.exists(archive) else {}
        folded, broken = [], []
        for path in dead:
            if os.path.getsize(path) == 0:  # died while creating it: nothing in it
                folded.append(path)
                continue
            try:
                values = _read_values(path)
            except (RuntimeError, struct.error, ValueError) as exc:
                broken.append((path, exc))  # corrupt: would fail every scrape
                continue
            for key, value in values:
                totals[key] = totals.get(key, 0.0) + value
            folded.append(path)
        # Not *.db: no scrape reads a half-written archive.
        staged = archive + ".new"
        _write_values(staged, totals)
        with self.lock:
            os.replace(staged, archive)
            for path in folded:
                os.unlink(path)
            for path, _ in broken:
                os.replace(path, path + ".corrupt")
        for path, exc in broken:
            emit("metrics_file_set_aside", logging.WARNING, file=os.path.basename(path),
                 error=repr(exc)[:200], reason="unreadable; its counts are lost")
        return len(folded)

    def fold_pending(self) -> int:
        """Fold every pid reported so far; on failure they stay pending for the next try."""
        with self._pending_lock:
            pids, self._pending = self._pending, set()
        try:
            return self.fold(pids)
        except Exception:
            with self._pending_lock:
                self._pending |= pids
            raise

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._pending_lock:
                waiting = bool(self._pending)
            self._wake.wait(RETRY_DELAY if waiting else None)
            if self._stop.wait(BATCH_DELAY):
                return
            self._wake.clear()
            self._fold_logged()

    def _fold_logged(self) -> None:
        """fold_pending() that never raises: a failure is logged when it starts and ends."""
        try:
            self.fold_pending()
        except Exception as exc:  # out of disk, of descriptors, or a bug: the thread lives on
            if not self._failing:
                self._failing = True
                emit("metrics_archive_failing", logging.ERROR, error=repr(exc)[:300],
                     retry_seconds=RETRY_DELAY)
            return
        if self._failing:
            self._failing = False
            emit("metrics_archive_recovered")
