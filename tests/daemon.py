"""A real pgtaskd daemon for the system tests: a subprocess, its JSON log, its children.

``Daemon`` writes a YAML config into a test's tmp_path, starts ``python -m supervisor.cli run``
in a new session (a process group of its own; each worker child it starts leads another),
sends stderr to a file, parses the JSON log lines as they come, waits for events with
deadlines, sends real signals, and at teardown kills the whole tree: the supervisor's process
group, plus every child pid the log ever announced (worker_spawned) and every process whose
parent is the supervisor, each with its own process group (what its handler started).

Nothing here is mocked: real processes, real signals, real PostgreSQL.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import resource
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parent
TEST_HANDLERS = TESTS_DIR / "handlers"

# Every handler the system tests use, on the import path tests/handlers. A type whose module
# cannot be imported (broken_import) is never here: every child of a pool that runs every
# type would fail to boot. Tests that want it add it with their own pools.
HANDLER_TYPES = {
    "echo": "basic:echo",
    "record": "basic:record",
    "fail": "basic:fail",
    "sleep": "basic:sleep",
    "suicide": "daemon_handlers:suicide",
    "suicide_later": "daemon_handlers:suicide_later",
    "slow_once": "daemon_handlers:slow_once",
    "slow": "daemon_handlers:slow",
    "permanent": "basic:permanent",
    "sleeps": "timed_handlers:sleeps",
    "holds_the_gil": "timed_handlers:holds_the_gil",
    "works": "timed_handlers:works",
    "gated": "timed_handlers:gated",
    "stops_itself": "timed_handlers:stops_itself",
    "sleeps_async": "timed_handlers:sleeps_async",
    "works_async": "timed_handlers:works_async",
    "gated_async": "timed_handlers:gated_async",
    "chatty": "timed_handlers:chatty",
    "chatty_async": "timed_handlers:chatty_async",
}


def base_tree() -> dict:
    """A fast config: short polls and maintenance intervals, immediate retries."""
    return {
        "database": {"connect_timeout": 2},
        "lease": {"seconds": 30, "renew_interval": 10},
        "poll_interval": 0.05,
        "retry": {"base_delay": 0, "max_delay": 0, "jitter": 0},
        "handlers": {"path": str(TEST_HANDLERS), "types": dict(HANDLER_TYPES)},
        "pools": {"default": {"processes": 2}},
        "shutdown_timeout": 3,
        "reaper": {"interval": 0.5},
        "health": {"interval": 0.5},
        "metrics": {"listen": ""},
    }


def merge_tree(base: dict, overrides: dict) -> dict:
    """Overrides win; a mapping section is merged one level deep, except ``pools``, which is
    replaced whole (a test that names its pools wants exactly those)."""
    tree = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for key, value in overrides.items():
        if key != "pools" and isinstance(value, dict) and isinstance(tree.get(key), dict):
            tree[key] = {**tree[key], **value}
        else:
            tree[key] = value
    return tree


def parse_ts(ts: str) -> float:
    """Wall-clock seconds of a log line's ``ts`` (UTC, millisecond resolution)."""
    stamp = dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ")
    return stamp.replace(tzinfo=dt.timezone.utc).timestamp()


def proc_stat(pid: int) -> dict | None:
    """ppid, pgid and state of a live process from /proc, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may contain spaces or parentheses.
    fields = raw[raw.rfind(")") + 2:].split()
    return {"state": fields[0], "ppid": int(fields[1]), "pgid": int(fields[2])}


def cmdline(pid: int) -> str:
    """The process title as ``ps`` shows it (setproctitle rewrites /proc/<pid>/cmdline)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def open_fds(pid: int) -> list[str]:
    """What each open descriptor of a process points at (``socket:[123]``, a path, ...)."""
    fds = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, ProcessLookupError):
        return fds
    for name in names:
        try:
            fds.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except (FileNotFoundError, ProcessLookupError):
            pass  # closed while we looked
    return fds


def nofile_limits(pid: int) -> tuple[int, int]:
    """The (soft, hard) open-files limit of a live process, from /proc."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-files limit in /proc/{pid}/limits")


def listening_socket_inode(port: int) -> str:
    """The inode of the TCP socket listening on 127.0.0.1:port, from /proc/net/tcp."""
    want = f"0100007F:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == want and fields[3] == "0A":  # 0A: LISTEN
            return fields[9]
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


def pid_alive(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat["state"] != "Z"


class DaemonExited(AssertionError):
    pass


class Daemon:
    # Where the pgtaskd it runs is imported from: this checkout, or an older release's
    # (tests/system/test_rolling_upgrade.py).
    code_dir = REPO_DIR

    def __init__(self, base_dir: Path, dsn: str, *, name: str = "daemon",
                 prefix: list[str] | None = None, **overrides: Any):
        """``prefix``: a command the daemon runs under, which execs it in place (``ip netns
        exec NS`` for a host of tests/hosts.py), so that its pid is still the daemon's."""
        self.name = name
        self.prefix = list(prefix or [])
        self.dir = Path(base_dir) / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.dir / "pgtaskd.yaml"
        self.log_path = self.dir / "stderr.log"
        self.dsn = dsn
        self.tree = merge_tree(base_tree(), overrides)
        self.process: subprocess.Popen | None = None
        self.events: list[dict] = []
        self.other_lines: list[str] = []  # anything on stderr that is not a JSON log line
        self.child_pids: set[int] = set()  # every child the log announced
        self._offset = 0
        self._partial = b""
        self._log_file = None
        self.started_wall: float | None = None

    # -- config -----------------------------------------------------------------------------

    def write_config(self, tree: dict | None = None) -> None:
        if tree is not None:
            self.tree = tree
        text = yaml.safe_dump(self.tree, sort_keys=False)
        self._replace(text)

    def write_raw_config(self, text: str) -> None:
        self._replace(text)

    def _replace(self, text: str) -> None:
        # Write then rename: a SIGHUP never reads a half-written file.
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config_path)

    @property
    def metrics_port(self) -> int | None:
        listen = self.tree.get("metrics", {}).get("listen") or ""
        return int(listen.rpartition(":")[2]) if listen else None

    @property
    def metrics_host(self) -> str:
        """Where this process reaches the endpoint: the address it listens on, or loopback
        for a wildcard."""
        host = (self.tree.get("metrics", {}).get("listen") or "").rpartition(":")[0]
        return "127.0.0.1" if host in ("", "0.0.0.0") else host

    # -- process ----------------------------------------------------------------------------

    def start(self, *, wait_ready: bool = True, timeout: float = 30.0,
              env: dict[str, str] | None = None,
              nofile: tuple[int, int] | None = None) -> "Daemon":
        """``env``: variables to add to the daemon's environment (e.g. NOTIFY_SOCKET).
        ``nofile``: the (soft, hard) RLIMIT_NOFILE the daemon starts with, like a unit's
        LimitNOFILE= (the usual default soft limit is 1024)."""
        assert self.process is None, "started twice"
        self.write_config()
        extra = env or {}
        env = {k: v for k, v in os.environ.items()
               if k not in ("PGTASKD_CONFIG", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID",
                            "RUNTIME_DIRECTORY", "PROMETHEUS_MULTIPROC_DIR")}
        env.update(extra)
        env["PGTASKD_DSN"] = self.dsn
        # Edited handler code must never come from a stale .pyc written by an earlier child.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.code_dir)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self._log_file = open(self.log_path, "ab")
        self.started_wall = time.time()
        self.process = subprocess.Popen(
            self.prefix + [sys.executable, "-m", "supervisor.cli", "run",
                           "-c", str(self.config_path)],
            stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=self._log_file,
            env=env, cwd=str(self.dir), start_new_session=True,
            # setrlimit between fork and exec is async-signal-safe, so preexec_fn is fine here.
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile))
            if nofile else None)
        if wait_ready:
            self.wait_for("supervisor_ready", timeout=timeout)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def send(self, signum: int) -> None:
        """A real signal to the supervisor process (only: never to the group)."""
        os.kill(self.pid, signum)

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name}: still running {timeout} s later\n"
                                 + self.log_tail()) from None
        finally:
            self.refresh()

    def children(self) -> list[int]:
        """Live (non-zombie) processes whose parent is the supervisor, from /proc."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            stat = proc_stat(int(entry))
            if stat and stat["ppid"] == self.pid and stat["state"] != "Z":
                pids.append(int(entry))
        return sorted(pids)

    def kill(self) -> None:
        """Teardown: SIGKILL the whole tree, whatever state it is in, and reap the parent."""
        if self.process is None:
            return
        self.refresh()
        try:
            candidates = set(self.child_pids) | set(self.children())
        except Exception:
            candidates = set(self.child_pids)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in candidates:
            # Each child leads a process group of its own (with whatever its handler started):
            # kill the group, and the child by pid if it is still one of ours. A group whose
            # leader is dead (gone, or a zombie) is what is left of our child: its pid cannot
            # be reused while the group or the zombie exists.
            title = cmdline(pid)
            stat = proc_stat(pid)
            ours = pid_alive(pid) and ("pgtaskd" in title or "supervisor.worker" in title)
            if ours or stat is None or stat["state"] == "Z":
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            if ours:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # -- the log ----------------------------------------------------------------------------

    def refresh(self) -> None:
        """Read what the daemon and its children wrote since last time."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            try:
                event = json.loads(line)
            except ValueError:
                if line.strip():
                    self.other_lines.append(line)
                continue
            if not isinstance(event, dict) or "event" not in event:
                self.other_lines.append(line)
                continue
            self.events.append(event)
            if event["event"] == "worker_spawned":
                self.child_pids.add(event["child_pid"])

    def mark(self) -> int:
        """A position in the event list; pass it as ``since`` to see only later events."""
        self.refresh()
        return len(self.events)

    def find(self, event: str, since: int = 0, **fields: Any) -> list[dict]:
        self.refresh()
        return [e for e in self.events[since:] if e["event"] == event and _matches(e, fields)]

    def wait_for(self, event: str, *, timeout: float = 20.0, since: int = 0, count: int = 1,
                 **fields: Any) -> dict:
        """Wait until ``count`` matching events were logged after ``since``; the last one.

        Fails at once (with the log) if the supervisor exits before that."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.find(event, since, **fields)
            if len(found) >= count:
                return found[count - 1]
            if self.returncode() is not None:
                found = self.find(event, since, **fields)  # a last read after the exit
                if len(found) >= count:
                    return found[count - 1]
                raise DaemonExited(f"{self.name} exited (code {self.returncode()}) before "
                                   f"{count}x {event} {fields}\n{self.log_tail()}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.name}: no {count}x {event} {fields} within "
                                     f"{timeout} s\n{self.log_tail()}")
            time.sleep(0.02)

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return f"--- last {lines} lines of {self.log_path} ---\n" + "\n".join(text[-lines:])

    # -- HTTP -------------------------------------------------------------------------------

    def http_get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        port = self.metrics_port
        assert port, "metrics.listen is off in this daemon's config"
        try:
            with urllib.request.urlopen(f"http://{self.metrics_host}:{port}{path}",
                                        timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def healthz(self) -> tuple[int, dict]:
        code, body = self.http_get("/healthz")
        return code, json.loads(body)

    def metrics(self) -> dict[str, list[tuple[dict, float]]]:
        """Samples of /metrics: sample name -> [(labels, value), ...]."""
        from prometheus_client.parser import text_string_to_metric_families

        code, body = self.http_get("/metrics")
        assert code == 200, f"/metrics answered {code}: {body[:300]!r}"
        samples: dict[str, list[tuple[dict, float]]] = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return samples


def metric_sum(samples: dict, name: str, **labels: str) -> float:
    """The sum of one sample name over every label set matching ``labels``."""
    return sum(value for sample_labels, value in samples.get(name, [])
               if all(sample_labels.get(k) == v for k, v in labels.items()))


def _matches(event: dict, fields: dict) -> bool:
    for key, expected in fields.items():
        if key not in event:
            return False
        value = event[key]
        if callable(expected):
            if not expected(value):
                return False
        elif value != expected:
            return False
    return True


# -- fixtures (test modules load them with pytest_plugins = ["daemon"]) ---------------------


@contextlib.contextmanager
def daemon_starter(base_dir: Path, default_dsn: str):
    """A function that starts daemons, for as long as the block runs; at its end every one of
    them, their children and the children's process groups die."""
    started: list[Daemon] = []

    def start(name: str = "daemon", *, dsn: str | None = None, wait_ready: bool = True,
              env: dict[str, str] | None = None, nofile: tuple[int, int] | None = None,
              prefix: list[str] | None = None, **overrides) -> Daemon:
        daemon = Daemon(base_dir, dsn or default_dsn, name=name, prefix=prefix, **overrides)
        started.append(daemon)
        daemon.start(wait_ready=wait_ready, env=env, nofile=nofile)
        return daemon

    try:
        yield start
    finally:
        for daemon in started:
            daemon.kill()
        for daemon in started:
            print(daemon.log_tail(150))  # shown by pytest only when the test failed


@pytest.fixture
def start_daemon(tmp_path, db_dsn):
    """Start daemons for a test; every one of them, their children and the children's process
    groups die at teardown."""
    with daemon_starter(tmp_path, db_dsn) as start:
        yield start
