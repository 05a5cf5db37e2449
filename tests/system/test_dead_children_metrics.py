"""A dead child's metric files are folded into the archive (a real daemon, real SIGKILLs).

prometheus_client leaves counter_<pid>.db and histogram_<pid>.db behind for every child that
ever lived, and every scrape reads them all: a crash loop made scrapes grow without bound.
Here the files of reaped children disappear into counter_archive.db / histogram_archive.db,
the directory keeps a fixed number of files, and the counters neither lose a count nor ever
go backwards while the folding runs beside scrapes.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from conftest import add_task, wait_until
from daemon import Daemon, metric_sum
from pgcluster import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(tmp_path, db_dsn):
    """One daemon with one worker, its metrics directory under tmp_path/run/metrics."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    d = Daemon(tmp_path, db_dsn, pools={"default": {"processes": 1}},
               metrics={"listen": f"127.0.0.1:{free_port()}"})
    d.metrics_dir = run_dir / "metrics"
    try:
        d.start(env={"RUNTIME_DIRECTORY": str(run_dir)})
        yield d
    finally:
        d.kill()
        print(d.log_tail(150))  # shown by pytest only when the test failed


class Scraper:
    """Scrapes /metrics in a thread until stopped; keeps every completed-count it saw."""

    def __init__(self, d: Daemon):
        self.d = d
        self.seen: list[float] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(0.05):
            try:
                samples = self.d.metrics()
            except (AssertionError, OSError) as exc:
                self.errors.append(repr(exc)[:300])
                continue
            self.seen.append(metric_sum(samples, "pgtaskd_tasks_completed_total"))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def db_files(d: Daemon) -> list[str]:
    return sorted(p.name for p in d.metrics_dir.glob("*.db"))


def test_dead_childrens_files_are_folded_and_no_count_is_lost(daemon, conn):
    d = daemon
    deaths = 5
    dead: list[int] = []
    with Scraper(d) as scraper:
        for i in range(deaths):
            add_task(conn, f"t{i}", "echo")
            d.wait_for("task_completed", task_id=f"t{i}")
            # The run time is observed just after that line: let it land before the kill.
            wait_until(lambda: metric_sum(d.metrics(), "pgtaskd_task_duration_seconds_count")
                       == i + 1, 10, message="the run time to be recorded")
            child = d.children()[0]
            mark = d.mark()
            os.kill(child, signal.SIGKILL)
            d.wait_for("worker_exited", child_pid=child)
            d.wait_for("worker_booted", since=mark, timeout=20)
            dead.append(child)

        def folded():
            names = db_files(d)
            return not [n for n in names if any(n.endswith(f"_{pid}.db") for pid in dead)]

        wait_until(folded, 10, message=f"the dead children's files to go: {db_files(d)}")
    # The live child's counter and histogram, the supervisor's counter, the two archives.
    names = db_files(d)
    assert len(names) <= 5, names
    assert {"counter_archive.db", "histogram_archive.db"} <= set(names), names

    samples = d.metrics()
    assert metric_sum(samples, "pgtaskd_tasks_completed_total") == deaths
    assert metric_sum(samples, "pgtaskd_tasks_claimed_total") == deaths
    assert metric_sum(samples, "pgtaskd_task_duration_seconds_count") == deaths
    assert metric_sum(samples, "pgtaskd_worker_restarts_total") == deaths
    assert not scraper.errors, scraper.errors[:5]
    assert scraper.seen, "no scrape succeeded"
    backwards = [(a, b) for a, b in zip(scraper.seen, scraper.seen[1:]) if b < a]
    assert not backwards, f"a counter went backwards: {backwards[:5]}"
