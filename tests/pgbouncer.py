"""A PgBouncer in transaction mode that a test starts in front of its PostgreSQL.

Its pool is smaller than a daemon's connection count, so server connections really are
shared between clients transaction by transaction. It listens on 127.0.0.1 only. PgBouncer
refuses to run as root; under root it runs as the unprivileged user tests/pgcluster.py uses.
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

from pgcluster import SERVICE_USER, free_port

BINARY = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer"
                                       if os.path.exists("/usr/sbin/pgbouncer") else None)


class TransactionPooler:
    def __init__(self, server_host: str, server_port: int, *, pool_size: int = 3):
        if BINARY is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.dir = Path(tempfile.mkdtemp(prefix="pgtaskd-pgbouncer-"))
        self.port = free_port()
        (self.dir / "users.txt").write_text('"postgres" ""\n')
        (self.dir / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={server_host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir / "users.txt"}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
logfile = {self.dir / "pgbouncer.log"}
pidfile = {self.dir / "pgbouncer.pid"}
""")
        self.user = SERVICE_USER if os.geteuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            for path in [self.dir, *self.dir.iterdir()]:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self.process: subprocess.Popen | None = None

    def dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def start(self, timeout: float = 10.0) -> None:
        self.process = subprocess.Popen([BINARY, str(self.dir / "pgbouncer.ini")],
                                        user=self.user, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer did not start: {self.log()[-2000:]}")

    def log(self) -> str:
        try:
            return (self.dir / "pgbouncer.log").read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
