"""A throwaway PostgreSQL that a test run starts, stops and restarts itself.

The binaries come from the ``pgserver`` wheel (the embedded default) or, without it, from the
``initdb`` on PATH. It listens on a free port on 127.0.0.1, and on any other address of this
machine a test created and names in ``listen`` (a bridge's, for network-namespace hosts,
whose subnets it then trusts). PostgreSQL refuses to run as
root, so under root the cluster belongs to an unprivileged ``pgserver`` user (the same user
pgserver itself creates). Tests that stop the database use their own instance of this class,
never the machine's server.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SERVICE_USER = "pgserver"


def find_bin_dir() -> Path:
    try:
        from pgserver._commands import POSTGRES_BIN_PATH
        if (POSTGRES_BIN_PATH / "initdb").exists():
            return POSTGRES_BIN_PATH
    except ImportError:
        pass
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise RuntimeError("no PostgreSQL binaries: pip install pgserver, or put initdb on PATH")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ThrowawayPostgres:
    def __init__(self, base_dir: Path | None = None, port: int | None = None, *,
                 durable: bool = False, listen: tuple[str, ...] = (),
                 trusted_networks: tuple[str, ...] = ()):
        # Not durable (the default, for speed): an immediate stop may lose the last commits
        # a client was told had landed. A test that stops the server in immediate mode and
        # counts what was lost needs durable commits, as in production.
        self.durable = durable
        self.listen = ("127.0.0.1", *listen)
        self.trusted_networks = trusted_networks  # CIDRs whose clients log in without password
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="pgtaskd-pg-"))
        self.data_dir = self.base_dir / "data"
        self.socket_dir = self.base_dir / "sock"
        self.port = port or free_port()
        self.bin_dir = find_bin_dir()
        self.user = None
        if os.geteuid() == 0:
            self.user = SERVICE_USER
            try:
                pwd.getpwnam(SERVICE_USER)
            except KeyError:
                subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", SERVICE_USER],
                               check=True, capture_output=True)

    def dsn(self, dbname: str = "postgres", host: str = "127.0.0.1") -> str:
        return f"postgresql://postgres@{host}:{self.port}/{dbname}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin_dir / args[0]), *args[1:]], check=check,
                              capture_output=True, text=True, user=self.user, timeout=120,
                              cwd=str(self.base_dir))

    def _own(self, path: Path) -> None:
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def init(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base_dir, 0o755)
        # Every folder above base_dir must be traversable by the service user.
        for parent in self.base_dir.parents:
            if parent == Path("/"):
                break
            mode = parent.stat().st_mode
            if not mode & 0o001:
                try:
                    os.chmod(parent, mode | 0o011)
                except PermissionError:
                    pass
        self._own(self.base_dir)
        self.socket_dir.mkdir(exist_ok=True)
        self._own(self.socket_dir)
        if not (self.data_dir / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                      "--encoding=UTF8", "--no-sync")
        if self.trusted_networks:
            hba = self.data_dir / "pg_hba.conf"
            lines = "".join(f"host all all {net} trust\n" for net in self.trusted_networks)
            with open(hba, "a") as handle:
                handle.write(lines)

    def start(self, timeout: float = 60) -> None:
        options = (f"-p {self.port} -k {self.socket_dir} "
                   f"-c listen_addresses={','.join(self.listen)} "
                   "-c fsync=off -c full_page_writes=off "
                   f"-c synchronous_commit={'on' if self.durable else 'off'} "
                   "-c max_connections=300 -c shared_buffers=128MB")
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.base_dir / "server.log"),
                  "-w", "-t", str(int(timeout)), "-o", options, "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop", check=False)

    def is_running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data_dir), "status", check=False).returncode == 0

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"PostgreSQL on port {self.port} not ready after {timeout} s")

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.base_dir, ignore_errors=True)
