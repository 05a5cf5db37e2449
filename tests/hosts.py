"""Hosts for the system tests: Linux network namespaces on a bridge the test run made.

Each host is a network namespace (and a UTS namespace, so its daemon reports a host name of
its own) with one end of a veth pair; the other end is a port of a bridge in the root
namespace, which holds the first address of a private /24 (10.213.x.0/24, an x that no
address or route of this machine uses). The run's own PostgreSQL (tests/pgcluster.py)
listens on the bridge's address, so each host reaches it over its own link, and each host
can be cut off, slowed or made lossy alone. Only addresses the run created are ever used.

Every name carries the pid of the pytest that made it (``pgtaskd-t<pid>-...`` for
namespaces; the bridge and the veths have short names, as the kernel wants, and carry the
pid in their alias): a run deletes what it made at teardown, whatever the test did, and at
its start whatever a killed run left behind (a pid no longer alive), never another live
run's.

Making namespaces needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip`` (iproute2); where
either is missing the tests that use them skip and say why.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from daemon import daemon_starter
from pgcluster import ThrowawayPostgres
from supervisor.db.migrate import migrate
from tcpproxy import TcpProxy

NAMESPACE_PREFIX = "pgtaskd-t"
LINK_PREFIX = "pgt"
ALIAS_PREFIX = "pgtaskd-test pid="
METRICS_PORT = 9464
TEMPLATE = "pgtaskd_hosts_template"


def tool(name: str) -> str | None:
    """A system tool's path; /usr/sbin counts even where PATH leaves it out."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([tool("ip") or "ip", *args], capture_output=True, text=True,
                          check=check, timeout=30)


def why_no_namespaces() -> str | None:
    """Why this machine cannot give the tests namespaces, or None."""
    if sys.platform != "linux":
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    if tool("ip") is None:
        return "no `ip` command (Debian package iproute2)"
    probe = f"{NAMESPACE_PREFIX}{os.getpid()}-probe"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    ip("netns", "delete", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _owner(name: str, prefix: str) -> int | None:
    """The pid in a name or alias made by a run of these tests, or None if not one."""
    if not name.startswith(prefix):
        return None
    digits = name[len(prefix):].split("-", 1)[0]
    return int(digits) if digits.isdigit() else None


def remove_stale() -> list[str]:
    """Delete the namespaces and links a killed run left; what was deleted."""
    removed = []
    listing = ip("netns", "list", check=False).stdout.split()
    for name in listing:
        owner = _owner(name, NAMESPACE_PREFIX)
        if owner is not None and not _alive(owner):
            ip("netns", "delete", name, check=False)
            removed.append(name)
    links = json.loads(ip("-j", "link", "show", check=False).stdout or "[]")
    for link in links:
        owner = _owner(link.get("ifalias") or "", ALIAS_PREFIX)
        if owner is not None and not _alive(owner) and link["ifname"].startswith(LINK_PREFIX):
            ip("link", "delete", link["ifname"], check=False)
            removed.append(link["ifname"])
    return removed


def free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    """A 10.213.x.0/24 that no address or route of this machine overlaps."""
    taken = []
    for entry in json.loads(ip("-j", "-4", "addr", "show").stdout or "[]"):
        for info in entry.get("addr_info", []):
            taken.append(ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}",
                                              strict=False))
    for route in json.loads(ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            try:
                taken.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                pass
    for x in rng.sample(range(1, 255), 254):
        subnet = ipaddress.ip_network(f"10.213.{x}.0/24")
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise RuntimeError("every 10.213.x.0/24 is in use on this machine")


class Network:
    """The bridge, its subnet, and PostgreSQL on its address."""

    def __init__(self):
        self.run = f"{os.getpid()}-{secrets.token_hex(2)}"
        self.tag = secrets.token_hex(3)  # interface names: at most 15 characters
        self.alias = f"{ALIAS_PREFIX}{os.getpid()}"
        self.subnet = free_subnet(random.Random())
        hosts = list(self.subnet.hosts())
        self.address = str(hosts[0])
        self._addresses = iter(hosts[9:])
        self.bridge = f"{LINK_PREFIX}{self.tag}br"
        self.server: ThrowawayPostgres | None = None
        self.hosts: list[Host] = []
        self._count = 0

    def create(self) -> None:
        ip("link", "add", "name", self.bridge, "type", "bridge")
        ip("link", "set", "dev", self.bridge, "alias", self.alias)
        ip("addr", "add", f"{self.address}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", "dev", self.bridge, "up")
        self.server = ThrowawayPostgres(listen=(self.address,),
                                        trusted_networks=(str(self.subnet),))
        self.server.init()
        self.server.start()
        with psycopg.connect(self.server.dsn(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{TEMPLATE}"')
        with psycopg.connect(self.server.dsn(TEMPLATE), autocommit=True) as conn:
            migrate(conn)
            # Where tests/handlers/basic.py records each run, as in conftest's template.
            conn.execute("CREATE TABLE test_runs (task_id TEXT, worker_id TEXT, "
                         "retry_count INT, pid INT, at TIMESTAMPTZ DEFAULT clock_timestamp())")

    def add_host(self) -> "Host":
        host = Host(self, self._count, str(next(self._addresses)))
        self._count += 1
        self.hosts.append(host)
        host.create()
        return host

    def destroy(self) -> None:
        for host in list(self.hosts):
            host.destroy()
        if self.server is not None:
            self.server.destroy()
        ip("link", "delete", self.bridge, check=False)


class Host:
    """A network namespace on the bridge, with one address."""

    def __init__(self, network: Network, index: int, address: str):
        self.network = network
        self.index = index
        self.address = address
        self.namespace = f"{NAMESPACE_PREFIX}{network.run}-h{index}"
        self.hostname = f"host{index}"
        self.veth = f"{LINK_PREFIX}{network.tag}v{index}"  # the bridge's end
        self.relay: TcpProxy | None = None  # see slow_down
        self.slowed_by = ""

    def create(self) -> None:
        ip("netns", "add", self.namespace)
        ip("link", "add", self.veth, "type", "veth", "peer", "name", "eth0",
           "netns", self.namespace)
        ip("link", "set", "dev", self.veth, "alias", self.network.alias)
        ip("link", "set", "dev", self.veth, "master", self.network.bridge, "up")
        ip("-n", self.namespace, "addr", "add",
           f"{self.address}/{self.network.subnet.prefixlen}", "dev", "eth0")
        ip("-n", self.namespace, "link", "set", "dev", "eth0", "up")
        ip("-n", self.namespace, "link", "set", "dev", "lo", "up")

    def destroy(self) -> None:
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        ip("netns", "delete", self.namespace, check=False)  # takes the veth pair with it
        ip("link", "delete", self.veth, check=False)
        if self in self.network.hosts:
            self.network.hosts.remove(self)

    @property
    def prefix(self) -> list[str]:
        """The command that runs a program on this host, in place (same pid)."""
        return [tool("ip") or "ip", "netns", "exec", self.namespace, "unshare", "--uts", "--",
                "sh", "-c", 'hostname "$0" && exec "$@"', self.hostname]

    def run(self, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a program on this host and wait for it."""
        return subprocess.run(self.prefix + argv, capture_output=True, text=True,
                              timeout=timeout)

    def http_status(self, port: int, path: str) -> int:
        """The status of a GET to this host's own address, sent from the host itself (it
        gets there while the host is cut off); 0 if nothing answered."""
        script = ("import sys, urllib.request, urllib.error\n"
                  "try:\n"
                  "    print(urllib.request.urlopen(sys.argv[1], timeout=5).status)\n"
                  "except urllib.error.HTTPError as exc:\n"
                  "    print(exc.code)\n"
                  "except OSError:\n"
                  "    print(0)\n")
        done = self.run([sys.executable, "-c", script,
                         f"http://{self.address}:{port}{path}"])
        return int(done.stdout.strip() or 0)

    def dsn(self, dbname: str) -> str:
        """How this host reaches the run's PostgreSQL: the bridge's address, or the relay in
        front of it when slow_down had to use one."""
        if self.relay is not None:
            return f"postgresql://postgres@{self.network.address}:{self.relay.port}/{dbname}"
        return self.network.server.dsn(dbname, host=self.network.address)

    # -- faults -----------------------------------------------------------------------------

    def cut(self) -> None:
        """Take the host's link down: whatever it sends, and whatever is sent to it, is lost
        (no RST, no FIN); its sockets stay open and TCP retransmits into the void."""
        ip("link", "set", "dev", self.veth, "down")

    def heal(self) -> None:
        ip("link", "set", "dev", self.veth, "up")

    def prepare_slow_path(self) -> str:
        """Make this host's link one that slow_down can slow later; how it will be done.
        Call before starting the host's daemon.

        ``tc netem`` on the bridge's end of the veth where the kernel has it. Where it lacks
        sch_netem (some VM kernels), the path is slowed in two parts: iptables' statistic
        match in the host's namespace drops packets into the host at random, and the host's
        connections to PostgreSQL go through a relay on the bridge's address that holds each
        exchange (the host's DSN points at it from now on). Skips where neither is possible."""
        netem = subprocess.run([tool("tc") or "tc", "qdisc", "add", "dev", self.veth, "root",
                                "netem", "delay", "0ms"], capture_output=True, text=True)
        if netem.returncode == 0:
            self.slowed_by = "tc netem"
            return self.slowed_by
        if tool("iptables") is None:
            pytest.skip(f"no tc netem ({netem.stderr.strip()}) and no iptables "
                        f"(Debian package iptables) to drop packets at random")
        listing = self.run([tool("iptables"), "-L", "INPUT", "-n"])
        if listing.returncode != 0:
            pytest.skip(f"no tc netem ({netem.stderr.strip()}) and iptables does not work "
                        f"here: {listing.stderr.strip()}")
        self.relay = TcpProxy("127.0.0.1", self.network.server.port,
                              listen_host=self.network.address)
        self.slowed_by = (f"iptables statistic drop + a relay holding each exchange "
                          f"(this kernel has no sch_netem: {netem.stderr.strip()})")
        return self.slowed_by

    def slow_down(self, delay: float, loss: float) -> None:
        """Delay what reaches this host by ``delay`` seconds and drop ``loss`` of it, this
        host only, as prepare_slow_path said it would."""
        if self.relay is None:
            subprocess.run([tool("tc") or "tc", "qdisc", "change", "dev", self.veth, "root",
                            "netem", "delay", f"{delay * 1000:g}ms", "loss", f"{loss * 100:g}%"],
                           check=True, capture_output=True, text=True)
            return
        self.run([tool("iptables"), "-A", "INPUT", "-i", "eth0", "-m", "statistic", "--mode",
                  "random", "--probability", f"{loss:g}", "-j", "DROP"]).check_returncode()
        self.relay.latency = delay

    def packets_dropped(self) -> int:
        """Packets the iptables rule of slow_down dropped so far (0 with netem, which does
        not count them here)."""
        if self.relay is None:
            return 0
        listing = self.run([tool("iptables"), "-L", "INPUT", "-v", "-x", "-n"])
        for line in listing.stdout.splitlines():
            if "statistic" in line:
                return int(line.split()[0])
        return 0


# -- fixtures (test modules load them with pytest_plugins = ["daemon", "hosts"]) ------------


@pytest.fixture(scope="session")
def host_network():
    """The run's bridge and the PostgreSQL on it; skips where namespaces are not allowed."""
    reason = why_no_namespaces()
    if reason:
        pytest.skip(f"no network-namespace hosts: {reason}")
    remove_stale()
    network = Network()
    try:
        network.create()
        yield network
    finally:
        network.destroy()


class Lab:
    """One test's hosts, database and daemons."""

    def __init__(self, network: Network, base_dir: Path, dbname: str):
        self.network = network
        self.base_dir = base_dir
        self.dbname = dbname
        self.dsn = network.server.dsn(dbname)  # the test's own way in: loopback
        self.start_daemon = None  # set by the fixture: daemon.daemon_starter's function
        self.hosts: list[Host] = []

    def add_hosts(self, count: int) -> list[Host]:
        made = [self.network.add_host() for _ in range(count)]
        self.hosts += made
        return made

    def start(self, host: Host, name: str | None = None, **kwargs):
        """A daemon on ``host``, reaching PostgreSQL over the host's link, its metrics on the
        host's address."""
        kwargs.setdefault("metrics", {"listen": f"{host.address}:{METRICS_PORT}"})
        return self.start_daemon(name or host.hostname, dsn=host.dsn(self.dbname),
                                 prefix=host.prefix, **kwargs)


@pytest.fixture
def host_lab(host_network, tmp_path):
    """Hosts on the run's bridge, a fresh database for this test, and daemons on the hosts;
    at teardown the daemons die, then the hosts go, then the database."""
    server = host_network.server
    dbname = f"pgtaskd_h_{secrets.token_hex(6)}"
    with psycopg.connect(server.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{dbname}" TEMPLATE "{TEMPLATE}"')
    lab = Lab(host_network, tmp_path, dbname)
    try:
        # The daemons die as this block ends, before their hosts go.
        with daemon_starter(tmp_path, lab.dsn) as lab.start_daemon:
            yield lab
    finally:
        for host in lab.hosts:
            host.destroy()
        with psycopg.connect(server.dsn(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
