"""The systemd side: the unit file passes systemd's own checks, and the daemon speaks the
sd_notify protocol (READY, RELOADING, STOPPING, STATUS, WATCHDOG) to a real datagram socket."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_DIR, TEST_HANDLERS, wait_until

UNIT = REPO_DIR / "systemd" / "pgtaskd.service"
# The web console's unit (pgtaskd web): held to the daemon's checks.
WEB_UNIT = REPO_DIR / "systemd" / "pgtaskd-web.service"
UNITS = pytest.mark.parametrize("unit_file", [UNIT, WEB_UNIT], ids=lambda p: p.name)
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


@needs_analyze
@UNITS
def test_unit_passes_systemd_analyze_verify(tmp_path, unit_file):
    # verify checks that ExecStart exists; point it at this checkout's console script and
    # change nothing else in the unit.
    script = Path(sys.executable).with_name("pgtaskd")
    assert script.exists(), "pgtaskd console script not installed next to the interpreter"
    text = unit_file.read_text().replace("/opt/pgtaskd/venv/bin/pgtaskd", str(script))
    unit = tmp_path / unit_file.name
    unit.write_text(text)
    result = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert unit_file.name not in result.stderr, result.stderr


@needs_analyze
@UNITS
def test_unit_security_exposure_is_at_most_2(unit_file):
    result = subprocess.run([ANALYZE, "security", "--offline=true", str(unit_file)],
                            capture_output=True, text=True)
    match = re.search(rf"Overall exposure level for {re.escape(unit_file.name)}: (\d+\.\d+)",
                      result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= 2.0, result.stdout


def test_web_unit_mirrors_the_daemons_sandbox():
    """Every sandboxing line of the daemon's unit is in the console's."""
    daemon = UNIT.read_text()
    web = WEB_UNIT.read_text()
    sandbox = daemon[daemon.index("NoNewPrivileges="):daemon.index("[Install]")]
    for line in sandbox.splitlines():
        if line and not line.startswith("#"):
            assert line in web.splitlines(), line
    assert "ExecStart=/opt/pgtaskd/venv/bin/pgtaskd web -c " in web


def test_unit_declares_what_the_daemon_relies_on():
    text = UNIT.read_text()
    for line in ("Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "KillMode=mixed",
                 "Restart=on-failure", "WatchdogSec=", "LimitNOFILE=", "TasksMax=",
                 "MemoryMax="):
        assert line in text, line
    stop = int(re.search(r"^TimeoutStopSec=(\d+)", text, re.M).group(1))
    config = (REPO_DIR / "etc" / "pgtaskd.yaml").read_text()
    shutdown = float(re.search(r"^shutdown_timeout:\s*([\d.]+)", config, re.M).group(1))
    assert stop > shutdown, "systemd must not SIGKILL the daemon before its own drain ends"


def _receive_all(sock: socket.socket) -> list[str]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(65536).decode())
        except BlockingIOError:
            return messages


def test_daemon_speaks_sd_notify(tmp_path, db_dsn):
    notify_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.setblocking(False)
    config = tmp_path / "pgtaskd.yaml"
    config.write_text(json.dumps({
        "poll_interval": 0.05,
        "handlers": {"path": str(TEST_HANDLERS), "types": {"echo": "basic:echo"}},
        "pools": {"default": {"processes": 2}},
        "metrics": {"listen": ""},
        "shutdown_timeout": 5,
    }))
    env = {**os.environ, "PGTASKD_DSN": db_dsn, "NOTIFY_SOCKET": str(notify_path),
           "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": ""}
    stderr = open(tmp_path / "daemon.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", "-c", str(config)],
                            env=env, stderr=stderr, stdout=subprocess.DEVNULL)
    received: list[str] = []

    def saw(field):
        received.extend(_receive_all(sock))
        return any(field in m.split("\n") for m in received)

    try:
        wait_until(lambda: saw("READY=1"), timeout=30, message="READY=1")
        # READY carries its STATUS in the same datagram: a reader never sees one without the other.
        ready = next(m for m in received if "READY=1" in m.split("\n"))
        assert any(f.startswith("STATUS=") for f in ready.split("\n")), ready
        wait_until(lambda: saw("WATCHDOG=1"), timeout=5, message="a watchdog ping")

        # The children must not be able to notify on the supervisor's behalf.
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert children
        for pid in children:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert not any(e.startswith(b"NOTIFY_SOCKET=") for e in environ)
            assert not any(e.startswith(b"WATCHDOG_USEC=") for e in environ)

        received.clear()
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: saw("RELOADING=1"), timeout=10, message="RELOADING=1")
        reloading = next(m for m in received if "RELOADING=1" in m.split("\n"))
        assert re.search(r"^MONOTONIC_USEC=\d+$", reloading, re.M)
        wait_until(lambda: saw("READY=1"), timeout=30, message="READY=1 after the reload")

        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: saw("STOPPING=1"), timeout=10, message="STOPPING=1")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stderr.close()
        sock.close()
