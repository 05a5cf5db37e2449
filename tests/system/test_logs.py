"""What an operator reads: JSON lines for the journal, a compact text line on a terminal, and a
handler's own prints and log records named after its task in both (issue 18.1, 18.2)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from conftest import TEST_HANDLERS, wait_until
from supervisor import Client

CONFIG = {"poll_interval": 0.05, "handlers": {"path": str(TEST_HANDLERS),
                                               "types": {"chatty": "basic:chatty"}},
          "pools": {"default": {"processes": 1}}, "metrics": {"listen": ""}}


def start_worker(tmp_path, db_dsn, stderr, log_format=None):
    config = tmp_path / "pgtaskd.yaml"
    config.write_text(json.dumps({**CONFIG, **({"logging": {"format": log_format}}
                                                if log_format else {})}))
    env = {k: v for k, v in os.environ.items() if k != "PGTASKD_LOG_FORMAT"}
    return subprocess.Popen([sys.executable, "-m", "supervisor.cli", "worker", "-c", str(config)],
                            env={**env, "PGTASKD_DSN": db_dsn}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=stderr)


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0


def test_json_lines_name_the_task_on_what_a_handler_prints_and_logs(tmp_path, db_dsn):
    with open(tmp_path / "err", "w") as err:
        proc = start_worker(tmp_path, db_dsn, err)
    try:
        Client(db_dsn).submit("chatty", payload={"word": "hello"}, task_id="c1")
        wait_until(lambda: '"no newline"' in (tmp_path / "err").read_text(), timeout=20,
                   message="the handler's last output")
    finally:
        stop(proc)
    lines = [json.loads(line) for line in (tmp_path / "err").read_text().splitlines()]
    ours = [line for line in lines if line.get("task_id") == "c1"
            and line["event"] in ("handler_output", "careful with c1")]
    assert [(line["event"], line.get("message")) for line in ours] == [
        ("handler_output", "said hello twice"), ("careful with c1", "careful with c1"),
        ("handler_output", "no newline")]
    for line in ours:
        assert line["task_type"] == "chatty" and line["worker_id"].endswith("default#1")
    assert ours[1]["logger"] == "chatty" and ours[1]["level"] == "warning"


def read_until(fd, needle: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {needle!r} within {timeout} s in {seen[-2000:]!r}")
        if select.select([fd], [], [], left)[0]:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


@pytest.mark.parametrize("log_format", [None, "text"])
def test_on_a_terminal_each_event_is_one_compact_text_line(tmp_path, db_dsn, log_format):
    """auto (the default) writes text to a terminal; colour only there."""
    leader, follower = pty.openpty()
    proc = start_worker(tmp_path, db_dsn, follower, log_format)
    os.close(follower)
    try:
        read_until(leader, b"worker_started", 20)
        Client(db_dsn).submit("chatty", payload={"word": "hello"}, task_id="c2")
        seen = read_until(leader, b"no newline", 20).decode()
    finally:
        stop(proc)
        os.close(leader)
    lines = seen.replace("\r\n", "\n").splitlines()
    claimed = next(line for line in lines if " task_claimed " in line)
    assert not claimed.startswith("{")
    assert " INFO  [" in claimed and "task_id=c2 task_type=chatty worker_id=" in claimed
    printed = next(line for line in lines if "handler_output" in line and "said" in line)
    assert 'task_id=c2 task_type=chatty' in printed and 'message="said hello twice"' in printed
    warned = next(line for line in lines if "careful with c2" in line)
    assert "\033[33mWARN" in warned, "a warning is yellow on a terminal"
    assert "logger=chatty" in warned and "message=" not in warned
