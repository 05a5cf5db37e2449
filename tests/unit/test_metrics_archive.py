"""Folding dead children's metric files (supervisor/maintenance/metrics_archive.py), no daemon.

The files are written with prometheus_client's own MmapedDict under fake pids, as a worker
child writes them. Values are whole numbers or multiples of 1/8, so every sum is exact and
"unchanged by folding" can mean equal.
"""

from __future__ import annotations

import os
import threading

import pytest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from supervisor.maintenance import metrics_archive
from supervisor.maintenance.metrics_archive import ArchiveCollector, MetricsArchive

TASK = ["pool", "task_type"]
BUCKETS = ("0.1", "1.0", "+Inf")
LIVE_PID = 1  # a live process: its files are never folded
DEAD_CHILDREN = 2000


def write_child(directory, pid: int) -> None:
    """The files a worker child leaves: counters by pool and type, and a run-time histogram."""
    counters = MmapedDict(os.path.join(directory, f"counter_{pid}.db"))
    histogram = MmapedDict(os.path.join(directory, f"histogram_{pid}.db"))
    try:
        for task_type in ("echo", "report", f"t{pid % 7}"):
            labels = ["default", task_type]
            counters.write_value(mmap_key("pgtaskd_tasks_completed",
                                          "pgtaskd_tasks_completed_total", TASK, labels,
                                          "Tasks completed"), float(pid % 5 + 1), 0.0)
            counters.write_value(mmap_key("pgtaskd_tasks_claimed", "pgtaskd_tasks_claimed_total",
                                          TASK, labels, "Tasks claimed"), float(pid % 3), 0.0)
            names = TASK + ["outcome"]
            values = labels + ["completed"]
            for i, le in enumerate(BUCKETS):
                key = mmap_key("pgtaskd_task_duration_seconds",
                               "pgtaskd_task_duration_seconds_bucket", names + ["le"],
                               values + [le], "Handler run time")
                histogram.write_value(key, float((pid + i) % 4), 0.0)
            histogram.write_value(mmap_key("pgtaskd_task_duration_seconds",
                                           "pgtaskd_task_duration_seconds_sum", names, values,
                                           "Handler run time"), (pid % 9) / 8, 0.0)
    finally:
        counters.close()
        histogram.close()


def scrape(directory) -> dict:
    """Every sample prometheus_client's own collector reads from the directory."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in MultiProcessCollector(None, path=str(directory)).collect()
            for s in family.samples}


def db_files(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".db"))


@pytest.fixture
def directory(tmp_path):
    write_child(tmp_path, LIVE_PID)
    return tmp_path


def test_folding_two_thousand_dead_children_keeps_every_total_in_five_files(directory):
    dead = range(1000, 1000 + DEAD_CHILDREN)
    for pid in dead:
        write_child(directory, pid)
    before = scrape(directory)
    assert len(db_files(directory)) == 2 * (DEAD_CHILDREN + 1)

    archive = MetricsArchive(str(directory), live_pids=lambda: [LIVE_PID])
    assert archive.fold(dead) == 2 * DEAD_CHILDREN

    assert scrape(directory) == before
    assert db_files(directory) == ["counter_1.db", "counter_archive.db", "histogram_1.db",
                                   "histogram_archive.db"]


def test_a_scrape_reads_as_many_files_after_ten_deaths_as_after_two_thousand(directory,
                                                                             monkeypatch):
    read: list[str] = []
    original = MmapedDict.read_all_values_from_file

    def counting(path):
        read.append(os.path.basename(path))
        return original(path)

    archive = MetricsArchive(str(directory), live_pids=lambda: [LIVE_PID])
    files_read = []
    for first, count in ((1000, 10), (2000, 2000)):
        for pid in range(first, first + count):
            write_child(directory, pid)
        archive.fold(range(first, first + count))
        monkeypatch.setattr(MmapedDict, "read_all_values_from_file", staticmethod(counting))
        read.clear()
        ArchiveCollector(archive).collect()
        monkeypatch.setattr(MmapedDict, "read_all_values_from_file", staticmethod(original))
        files_read.append(len(read))
    # The live child's two files and the two archives, whatever died before.
    assert files_read == [4, 4], files_read


def test_scrapes_during_a_fold_see_every_count_once(directory):
    dead = range(1000, 1400)
    for pid in dead:
        write_child(directory, pid)
    expected = scrape(directory)
    archive = MetricsArchive(str(directory), live_pids=lambda: [LIVE_PID])
    collector = ArchiveCollector(archive)
    seen, errors = [], []
    done = threading.Event()

    def scrape_until_done():
        while not done.is_set():
            try:
                seen.append({(s.name, tuple(sorted(s.labels.items()))): s.value
                             for family in collector.collect() for s in family.samples})
            except Exception as exc:
                errors.append(repr(exc))

    scraper = threading.Thread(target=scrape_until_done)
    scraper.start()
    try:
        for chunk in range(1000, 1400, 50):  # several folds, each swapping the archive
            archive.fold(range(chunk, chunk + 50))
    finally:
        done.set()
        scraper.join()
    assert not errors, errors[:3]
    assert seen and all(totals == expected for totals in seen)


def test_a_pid_a_live_child_uses_again_is_not_folded(directory):
    write_child(directory, 4242)
    archive = MetricsArchive(str(directory), live_pids=lambda: [LIVE_PID, 4242])
    assert archive.fold([4242]) == 0
    assert "counter_4242.db" in db_files(directory)


def test_an_empty_file_of_a_child_still_starting_does_not_break_a_scrape(directory):
    # A new child creates its file, then sizes it: a scrape may come in between.
    (directory / "counter_777.db").write_bytes(b"")
    archive = MetricsArchive(str(directory))
    totals = {s.name for family in ArchiveCollector(archive).collect() for s in family.samples}
    assert "pgtaskd_tasks_completed_total" in totals
    # If that child died right there, its empty file just goes.
    assert archive.fold([777]) == 1
    assert "counter_777.db" not in db_files(directory)


def test_a_corrupt_file_is_set_aside_and_the_rest_folded(directory):
    write_child(directory, 5000)
    expected = scrape(directory)
    (directory / "counter_5001.db").write_bytes(b"\xff\xff\x00\x00" + b"\x00" * 60)
    archive = MetricsArchive(str(directory))
    assert archive.fold([5000, 5001]) == 2
    assert (directory / "counter_5001.db.corrupt").exists()
    assert scrape(directory) == expected


def test_a_failed_fold_deletes_nothing_and_is_tried_again(directory, monkeypatch):
    write_child(directory, 6000)
    expected = scrape(directory)
    archive = MetricsArchive(str(directory))
    archive.child_died(6000)

    def full_disk(path, totals):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(metrics_archive, "_write_values", full_disk)
        with pytest.raises(OSError):
            archive.fold_pending()
    assert "counter_6000.db" in db_files(directory)
    assert scrape(directory) == expected
    assert archive.fold_pending() == 2
    assert scrape(directory) == expected
    assert "counter_6000.db" not in db_files(directory)
