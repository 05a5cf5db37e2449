"""Each claim is renewed by the lease settings it was made under (issue 14, item 1): a real
daemon, a real SIGHUP, and every execution recorded outside the database
(tests/handlers/timed_handlers.py)."""

from __future__ import annotations

import signal
import pytest

from conftest import add_task, task_row, wait_until
from daemon import HANDLER_TYPES, merge_tree
from executions import overlaps, read_runs

pytest_plugins = ["daemon"]

pytestmark = pytest.mark.slow


def test_a_claim_made_during_a_reload_that_shortens_the_lease_keeps_it(start_daemon, conn,
                                                                        tmp_path):
    """The new generation claims with a 4 s lease while the reload is still in progress (one
    new pool is still importing its handlers), so the keeper still has the old 10 s renew
    interval: renewed by that, the lease would lapse and a second child would run the task."""
    log = tmp_path / "runs.log"
    d = start_daemon(lease={"seconds": 30, "renew_interval": 10},
                     pools={"old": {"processes": 1, "task_types": ["echo"]}},
                     env={"SLOW_IMPORT_SECONDS": "25"})
    mark = d.mark()
    d.write_config(merge_tree(d.tree, {
        "lease": {"seconds": 4, "renew_interval": 1},
        "handlers": {"path": d.tree["handlers"]["path"],
                     "types": {**HANDLER_TYPES, "slow_import": "slow_import:handle"}},
        "pools": {"fast": {"processes": 2, "task_types": ["works"]},
                  "slow": {"processes": 1, "task_types": ["slow_import"]}},
    }))
    d.send(signal.SIGHUP)
    d.wait_for("worker_booted", since=mark, count=2, pool="fast", timeout=30)
    add_task(conn, "T", "works", {"seconds": 8, "log": str(log)})
    wait_until(lambda: task_row(conn, "T")["status"] in ("COMPLETED", "FAILED"), timeout=40,
               message="the task to end")
    runs = read_runs(log)
    assert (task_row(conn, "T")["status"], len(runs)) == ("COMPLETED", 1), runs
    assert overlaps(runs) == []
    assert d.find("reload_finished", since=mark) == [], "the reload finished too early to test"
