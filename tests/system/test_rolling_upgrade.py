"""A rolling upgrade with a daemon of an earlier release, built from this repository's history.

Two releases are taken from git, each the commit before a migration was added:

- before the newest migration marked ``-- pgtaskd: older daemons may run on this``: every
  migration the new code adds to its schema is so marked, so the old daemon keeps running
  beside the new one until it is stopped, as a rolling deploy stops it;
- before the newest migration NOT so marked: the old daemon's health check finds it, the
  daemon says so, lets its running tasks finish, and exits with status 4; started again, it
  refuses in one line.

The old code runs from ``git archive`` of its ``supervisor/`` package on PYTHONPATH with this
checkout's interpreter (its dependencies are the same), so nothing is installed. Handlers
record every execution outside the database (tests/handlers/timed_handlers.py): nothing
lost, no two runs of a task at once, none run twice, and the global limit never exceeded,
whichever release's daemon ran what.
"""

from __future__ import annotations

import re
import signal
import subprocess
import io
import tarfile
import time
from pathlib import Path

import psycopg
import pytest

from conftest import wait_until
from daemon import REPO_DIR, Daemon
from executions import audit, most_at_once, read_runs
from supervisor import Client
from supervisor.db.migrate import available_migrations
from supervisor.errors import EXIT_SCHEMA

MIGRATIONS = "supervisor/db/migrations"
# Above what one daemon's two children can hold: the other daemon's children contend for it.
LIMIT = 3
HANDLERS = {"limited": "timed_handlers:sleeps", "free": "timed_handlers:sleeps"}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout


@pytest.fixture(scope="session")
def history() -> None:
    """Skips, before any database is made, where the earlier releases cannot be built."""
    try:
        git("rev-parse", "--git-dir")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the earlier releases are built from its history")
    if git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.skip("a shallow clone: the earlier releases' commits are not in it "
                    "(fetch with --unshallow)")


def release_before(migration) -> str:
    """The commit before the one that added ``migration``'s file."""
    added = git("log", "--diff-filter=A", "--format=%H", "--",
                f"{MIGRATIONS}/{migration.label}.sql").split()
    if not added:
        pytest.skip(f"no commit in this history adds {migration.label}")
    return git("rev-parse", f"{added[-1]}^").strip()


def migrations_at(commit: str) -> set[int]:
    names = git("ls-tree", "--name-only", commit, f"{MIGRATIONS}/").split()
    return {int(m[1]) for m in (re.search(r"/(\d{4})_\w+\.sql$", n) for n in names) if m}


@pytest.fixture(scope="session")
def old_release(tmp_path_factory):
    """Builds an earlier release's package once per session: ``old_release(commit)`` is a
    folder holding its ``supervisor/``."""
    built: dict[str, Path] = {}

    def build(commit: str) -> Path:
        if commit not in built:
            folder = tmp_path_factory.mktemp(f"release-{commit[:10]}")
            archive = subprocess.run(["git", "-C", str(REPO_DIR), "archive", commit,
                                      "supervisor"], capture_output=True, check=True,
                                     timeout=60).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                # Pythons without extraction filters (before 3.11.4) extract as they always did.
                extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tar.extractall(folder, **extra)
            built[commit] = folder
        return built[commit]

    return build


@pytest.fixture
def daemons(tmp_path):
    """Daemons of either release; every one killed with its children at teardown."""
    started: list[Daemon] = []

    def start(name: str, dsn: str, code_dir: Path = REPO_DIR, **kwargs) -> Daemon:
        daemon = Daemon(tmp_path, dsn, name=name, handlers={"path": str(REPO_DIR / "tests" /
                                                                         "handlers"),
                                                            "types": HANDLERS},
                        pools={"default": {"processes": 2}}, limits={"limited": LIMIT})
        daemon.code_dir = code_dir
        started.append(daemon)
        return daemon.start(**kwargs)

    yield start
    for daemon in started:
        daemon.kill()
    for daemon in started:
        print(daemon.log_tail(60))


def submit(dsn: str, log: Path, prefix: str, limited: int, free: int,
           seconds: float = 0.05) -> list[str]:
    # The limited ones first (a higher priority), so that both daemons' children meet at the
    # limit while the other type keeps the rest busy.
    tasks = ([{"task_type": "limited", "task_id": f"{prefix}-lim{n}", "priority": 1,
               "payload": {"log": str(log), "seconds": seconds * 4}} for n in range(limited)]
             + [{"task_type": "free", "task_id": f"{prefix}-free{n}",
                 "payload": {"log": str(log), "seconds": seconds}} for n in range(free)])
    with Client(dsn) as client:
        client.submit_many(tasks)
    return [task["task_id"] for task in tasks]


def statuses(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM tasks GROUP BY 1").fetchall())


def schema_versions(dsn: str) -> set[int]:
    with psycopg.connect(dsn) as conn:
        return {v for (v,) in conn.execute("SELECT version FROM pgtaskd_schema_migrations")}


def runs_by(daemon: Daemon, runs: list[dict]) -> list[dict]:
    daemon.refresh()
    return [run for run in runs if run["pid"] in daemon.child_pids]


def check_runs(runs: list[dict], task_ids: list[str]) -> None:
    report = audit(runs, task_ids, ended_by={})
    assert report["problems"] == [], report["problems"][:10]
    assert report["duplicates"] == 0
    limited = [run for run in runs if "-lim" in run["task_id"]]
    assert most_at_once(limited) <= LIMIT


def test_an_older_daemon_runs_beside_a_migrating_one_until_a_rolling_deploy_stops_it(
        history, old_release, daemons, empty_db_dsn, tmp_path):
    migrations = available_migrations()
    newest_marked = max((m for m in migrations if m.older_daemons_ok), key=lambda m: m.version)
    commit = release_before(newest_marked)
    added = {m for m in migrations if m.version not in migrations_at(commit)}
    # What makes this scenario the compatible one: every migration the old code lacks is
    # marked for it.
    assert newest_marked in added and all(m.older_daemons_ok for m in added), \
        [m.label for m in added]

    log = tmp_path / "runs.log"
    old = daemons("old", empty_db_dsn, old_release(commit))
    assert not schema_versions(empty_db_dsn) & {m.version for m in added}
    task_ids = submit(empty_db_dsn, log, "a", limited=10, free=40)
    wait_until(lambda: len(runs_by(old, read_runs(log))) >= 4, timeout=20,
               message="the old daemon to run tasks")

    new = daemons("new", empty_db_dsn)
    migrated = time.monotonic()
    assert schema_versions(empty_db_dsn) >= {m.version for m in added}
    task_ids += submit(empty_db_dsn, log, "b", limited=10, free=40)
    # Both releases claim after the migration, limited tasks included.
    wait_until(lambda: all(any(run["start"] > migrated and "-lim" in run["task_id"]
                               for run in runs_by(daemon, read_runs(log)))
                           for daemon in (old, new)),
               timeout=30, message="both daemons to run limited tasks after the migration")

    old.send(signal.SIGTERM)  # the rolling deploy reaches the old daemon's host
    assert old.wait_exit(15) == 0
    assert not old.find("schema_newer")
    wait_until(lambda: statuses(empty_db_dsn) == {"COMPLETED": len(task_ids)}, timeout=40,
               message="every task to complete")
    runs = read_runs(log)
    check_runs(runs, task_ids)
    print(f"\nrolling upgrade from {commit[:10]} (through {newest_marked.label}): "
          f"{len(task_ids)} tasks, {len(runs_by(old, runs))} run by the old daemon, "
          f"{len(runs_by(new, runs))} by the new one; at most "
          f"{most_at_once([r for r in runs if '-lim' in r['task_id']])} limited at once")


def test_an_older_daemon_stops_in_one_line_when_a_migration_is_not_marked_for_it(
        history, old_release, daemons, empty_db_dsn, tmp_path):
    migrations = available_migrations()
    newest_unmarked = max((m for m in migrations if not m.older_daemons_ok),
                          key=lambda m: m.version)
    commit = release_before(newest_unmarked)
    assert newest_unmarked.version not in migrations_at(commit)

    log = tmp_path / "runs.log"
    old = daemons("old", empty_db_dsn, old_release(commit))
    # Long enough that the old daemon is still running limited tasks when it finds out.
    task_ids = submit(empty_db_dsn, log, "a", limited=6, free=16, seconds=0.25)
    wait_until(lambda: any("-lim" in run["task_id"] for run in runs_by(old, read_runs(log))),
               timeout=20, message="the old daemon to run a limited task")

    new = daemons("new", empty_db_dsn)
    assert newest_unmarked.version in schema_versions(empty_db_dsn)
    assert old.wait_exit(20) == EXIT_SCHEMA
    wait_until(lambda: statuses(empty_db_dsn) == {"COMPLETED": len(task_ids)}, timeout=40,
               message="the new daemon to complete every task")

    stopped = old.find("schema_newer")
    assert len(stopped) == 1
    assert newest_unmarked.label in stopped[0]["error"]
    # One line says why: no traceback, no worker failing on the new schema meanwhile.
    assert old.other_lines == []
    errors = [e for e in old.events if e.get("level") in ("error", "critical")
              and e["event"] not in ("schema_newer", "supervisor_failed")]
    assert errors == []
    runs = read_runs(log)
    assert runs_by(old, runs) and runs_by(new, runs)
    check_runs(runs, task_ids)

    # As a unit without RestartPreventExitStatus would: started again, it refuses at once.
    again = daemons("old-again", empty_db_dsn, old_release(commit), wait_ready=False)
    assert again.wait_exit(30) == EXIT_SCHEMA
    assert not again.find("worker_spawned")
    refused = again.find("supervisor_failed")
    assert len(refused) == 1 and newest_unmarked.label in refused[0]["error"]
    assert again.other_lines == []
    print(f"\nunmarked {newest_unmarked.label}: the daemon of {commit[:10]} ran "
          f"{len(runs_by(old, runs))} tasks, logged schema_newer and exited "
          f"{EXIT_SCHEMA}; {len(runs_by(new, runs))} ran on the new daemon")
