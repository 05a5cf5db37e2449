"""The Quickstart's daemon: the example config (etc/pgtaskd.yaml) with ``--demo`` runs its demo
tasks, the async notify tasks on the I/O pool's event loop, many at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import REPO_DIR, wait_until

pytestmark = pytest.mark.slow


def test_the_example_config_runs_the_demo_tasks(tmp_path, db_dsn, conn):
    text = (REPO_DIR / "etc" / "pgtaskd.yaml").read_text()
    for old, new in (("path: ../handlers", f"path: {REPO_DIR / 'handlers'}"),
                     ('listen: "127.0.0.1:9464"', 'listen: ""')):
        assert old in text, old
        text = text.replace(old, new)
    config = tmp_path / "pgtaskd.yaml"
    config.write_text(text)
    log = open(tmp_path / "daemon.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", "-c", str(config),
                             "--demo"], env={**os.environ, "PGTASKD_DSN": db_dsn},
                            stdout=subprocess.DEVNULL, stderr=log)
    try:
        def notified():
            return conn.execute("SELECT count(*) FILTER (WHERE status = 'COMPLETED'), count(*) "
                                "FROM tasks WHERE task_type = 'notify'").fetchone()
        wait_until(lambda: notified()[1] and notified()[0] == notified()[1], timeout=30,
                   message="the demo's notify tasks to complete")
        claims = [json.loads(line) for line in (tmp_path / "daemon.log").read_text().splitlines()
                  if '"task_claimed"' in line]
        pools = {}
        for claim in claims:
            pools.setdefault(claim["task_type"], set()).add(claim["pool"])
        # Each pool isolates what its comment says (18.9: the report ran on default).
        assert pools.get("notify") == {"io"}, pools
        wait_until(lambda: conn.execute("SELECT count(*) FROM tasks WHERE task_type = 'report' "
                                        "AND status <> 'PENDING'").fetchone()[0], timeout=30,
                   message="the demo's report task to be claimed")
        claims = [json.loads(line) for line in (tmp_path / "daemon.log").read_text().splitlines()
                  if '"task_claimed"' in line and '"report"' in line]
        assert claims and {claim["pool"] for claim in claims} == {"reports"}, claims
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(40) == 0
        log.close()
