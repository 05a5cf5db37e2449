"""18.7: the shipped Grafana dashboard and Prometheus alert rules (etc/grafana, etc/prometheus)
hold together: promtool checks the rules and runs their unit tests (one case that fires and
one that does not per alert), the dashboard is import-ready, and every metric either names
exists in a real daemon's /metrics."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import add_task
from daemon import metric_sum
from daemon_checks import FINAL, wait_status
from pgcluster import free_port
from supervisor.db import store

pytest_plugins = ["daemon"]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "etc" / "grafana" / "pgtaskd.json"
RULES = ROOT / "etc" / "prometheus" / "pgtaskd-alerts.yml"
RULE_TESTS = ROOT / "etc" / "prometheus" / "pgtaskd-alerts.test.yml"
ALERTS = {"PgtaskdDown", "PgtaskdBacklogTooOld", "PgtaskdFailureRatioHigh",
          "PgtaskdExpiredLeasesUnreaped", "PgtaskdPoolFused", "PgtaskdReloadFailed",
          "PgtaskdLimitSaturated", "PgtaskdStaleResultsRising"}
METRIC = re.compile(r"\bpgtaskd_[a-z_]+")
# Present only while a pool is fused: tests/system/test_daemon.py sees it then.
ONLY_SOMETIMES = {"pgtaskd_pool_fused"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian's prometheus package brings it; "
                    ".ci/run installs it)")
    return path


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def test_promtool_checks_the_rules_and_runs_their_tests():
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run([tool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                            capture_output=True, text=True, timeout=60)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_alert_has_a_case_that_fires_and_one_that_does_not():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert {rule["alert"] for group in groups for rule in group["rules"]} == ALERTS
    fires, quiet = set(), set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert fires == ALERTS and quiet == ALERTS, (ALERTS - fires, ALERTS - quiet)


def test_the_dashboard_is_import_ready_with_a_datasource_variable():
    board = json.loads(DASHBOARD.read_text())
    assert board["title"] and board["uid"] and board["schemaVersion"] >= 30
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in board["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
    titles = " ".join(panel["title"].lower() for panel in board["panels"])
    for topic in ("type and outcome", "queue depth", "oldest due", "limits", "failures",
                  "lease", "restarts", "reloads"):
        assert topic in titles, topic


def declared_names(families) -> set[str]:
    """The sample names each family may show, by prometheus_client's suffix rules."""
    names = set()
    for family in families:
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


@pytest.mark.slow
def test_every_metric_of_the_dashboard_and_the_rules_exists_in_a_daemons_metrics(
        start_daemon, conn):
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    d = start_daemon(pools={"default": {"processes": 2}}, limits={"sleep": 2},
                     metrics={"listen": f"127.0.0.1:{port}"})
    store.pause_task_type(conn, "record", paused_by="test")
    ids = [add_task(conn, f"ok-{i}", "echo") for i in range(4)]
    ids += [add_task(conn, f"fail-{i}", "fail", max_retries=1) for i in range(2)]
    wait_status(conn, ids, FINAL, timeout=30, daemons=[d])
    mark = d.mark()
    d.send(signal.SIGHUP)
    d.wait_for("reload_finished", since=mark, timeout=30)

    code, body = d.http_get("/metrics")
    assert code == 200
    families = list(text_string_to_metric_families(body.decode()))
    declared = declared_names(families)
    with_samples = {sample.name for family in families for sample in family.samples}
    referenced = {name for expr in dashboard_exprs() + rule_exprs()
                  for name in METRIC.findall(expr)}
    assert len(referenced) > 20, referenced
    assert not referenced - declared, f"not in /metrics: {sorted(referenced - declared)}"
    empty = referenced - with_samples - ONLY_SOMETIMES
    assert not empty, f"declared but without a sample: {sorted(empty)}"
    samples = d.metrics()
    assert metric_sum(samples, "pgtaskd_reloads_total", outcome="succeeded") == 1
    assert metric_sum(samples, "pgtaskd_tasks_failed_total", task_type="fail") == 2
    assert metric_sum(samples, "pgtaskd_task_type_paused", task_type="record") == 1
