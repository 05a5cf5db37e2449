"""A real ``pgtaskd web`` process for the console's tests: its config written to a folder,
started as an operator would, its JSON log kept, requests made to it over 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import yaml

from conftest import REPO_DIR, wait_until
from pgcluster import free_port

PASSWORD = "correct horse battery staple"


def password_hash() -> str:
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "web", "hash-password"],
                            input=PASSWORD + "\n", capture_output=True, text=True, timeout=30,
                            cwd=REPO_DIR)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


class WebConsole:
    def __init__(self, folder: Path, dsn: str, *, web: dict | None = None, **tree):
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.folder = folder
        config = {"database": {"dsn": dsn}, "metrics": {"listen": ""},
                  "web": {"listen": f"127.0.0.1:{self.port}", "refresh_interval": 0.5,
                          **(web or {})}, **tree}
        self.config_path = folder / "pgtaskd.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = folder / "web.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "WebConsole":
        env = {k: v for k, v in os.environ.items() if k not in ("PGTASKD_DSN", "PGTASKD_CONFIG")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "web", "-c", str(self.config_path)],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "w"), env=env, cwd=REPO_DIR)
        wait_until(self._answers, timeout=20, message=f"pgtaskd web on {self.url}")
        return self

    def _answers(self) -> bool:
        assert self.proc.poll() is None, self.log_path.read_text()
        try:
            return self.request("GET", "/login")[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log(self) -> list[dict]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines()
                if line.startswith("{")]

    def request(self, method: str, path: str, *, body: dict | None = None,
                headers: dict | None = None, timeout: float = 10.0
                ) -> tuple[int, dict, str]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = urllib.parse.urlencode(body).encode() if body is not None else None
            sent = dict(headers or {})
            if data is not None:
                sent["Content-Type"] = "application/x-www-form-urlencoded"
            connection.request(method, path, body=data, headers=sent)
            response = connection.getresponse()
            return (response.status, {k.lower(): v for k, v in response.getheaders()},
                    response.read().decode("utf-8", "replace"))
        finally:
            connection.close()

    def session(self) -> tuple[str, str]:
        """A fresh anonymous session: its cookie header and its CSRF token."""
        status, headers, page = self.request("GET", "/login")
        assert status == 200
        cookie = headers["set-cookie"].split(";")[0]
        token = re.search(r'name="csrf-token" content="([^"]+)"', page)[1]
        return cookie, token

    def log_in(self) -> tuple[str, str]:
        """A session of the user ``ops`` (PASSWORD): its cookie header and its CSRF token."""
        cookie, token = self.session()
        status, headers, _ = self.request(
            "POST", "/login", body={"csrf": token, "user": "ops", "password": PASSWORD},
            headers={"Cookie": cookie})
        assert status == 303
        cookie = headers["set-cookie"].split(";")[0]
        _, _, page = self.request("GET", "/login", headers={"Cookie": cookie})
        return cookie, re.search(r'name="csrf-token" content="([^"]+)"', page)[1]
