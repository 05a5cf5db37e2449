"""The daemon registry against a real PostgreSQL: a daemon's row written by its heartbeat,
read by the client, shown lost past its threshold, signed off at a stop, pruned a day later.

The registry thread is built in the test (not started, except to see it sign off) with a
snapshot the test sets. Time is moved by writing an old heartbeat, never by sleeping.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from conftest import wait_until
from supervisor import Client, __version__
from supervisor.config import REGISTRY_KEPT_SECONDS, REGISTRY_LOST_FLOOR, parse_config
from supervisor.daemon.services import daemon_identity
from supervisor.daemon.snapshot import ChildSnapshot, ChildTask, DaemonSnapshot
from supervisor.errors import UsageError
from supervisor.maintenance.registry import DaemonIdentity, DaemonRegistry

pytest_plugins = ["worker_fixtures"]

WORKING = ChildSnapshot("default", 1, 4101, 1, "working", None, 3, (
    ChildTask("t-run", "echo", "running"), ChildTask("t-wait", "echo", "claimed"),
    ChildTask("t-done", "echo", "finished")))
IDLE = ChildSnapshot("reports", 1, 4102, 1, "idle", None, 0, ())


@pytest.fixture
def registry(db_dsn):
    """Build registries on the test database; stopped and closed after the test."""
    built: list[DaemonRegistry] = []

    def build(snapshot: DaemonSnapshot, *, interval: float = 5.0,
              daemon: str = "host-a:/etc/pgtaskd.yaml") -> DaemonRegistry:
        identity = DaemonIdentity(id=str(uuid.uuid4()), daemon=daemon, host="host-a",
                                  pid=4100 + len(built), version=__version__,
                                  config_path="/etc/pgtaskd.yaml")
        service = DaemonRegistry(db_dsn, interval=interval, identity=identity,
                                 snapshot=lambda: service.current)
        service.current = snapshot
        built.append(service)
        return service

    yield build
    for service in built:
        if service.is_alive():
            service.stop()
        service._close()


@pytest.fixture
def client(db_dsn):
    with Client(db_dsn) as owned:
        yield owned


def age_heartbeat(conn, daemon_id: str, seconds: float) -> None:
    conn.execute("UPDATE pgtaskd_daemons SET heartbeat_at = now() - %s * interval '1 second' "
                 "WHERE id = %s", (seconds, daemon_id))


def test_a_heartbeat_registers_the_daemon_and_the_next_rewrites_its_row(registry, client,
                                                                         conn, events):
    service = registry(DaemonSnapshot(1, "running", (WORKING, IDLE)))
    assert service.run_once() == {"state": "running", "generation": 1, "registered": True,
                                  "pruned": 0}
    [row] = client.daemons()
    me = service.identity
    assert {k: row[k] for k in ("id", "daemon", "host", "pid", "version", "config_path",
                                "generation", "state", "reported_state",
                                "heartbeat_interval")} == {
        "id": me.id, "daemon": me.daemon, "host": "host-a", "pid": me.pid,
        "version": __version__, "config_path": "/etc/pgtaskd.yaml", "generation": 1,
        "state": "running", "reported_state": "running", "heartbeat_interval": 5.0}
    assert row["started_at"] == row["heartbeat_at"]
    assert row["pools"] == {
        "default": [{"slot": 1, "pid": 4101, "generation": 1, "state": "working",
                     "stopping": None, "held": 3,
                     "tasks": [{"id": "t-run", "type": "echo", "state": "running"},
                               {"id": "t-wait", "type": "echo", "state": "claimed"},
                               {"id": "t-done", "type": "echo", "state": "finished"}]}],
        "reports": [{"slot": 1, "pid": 4102, "generation": 1, "state": "idle",
                     "stopping": None, "held": 0, "tasks": []}]}
    assert [e["daemon_id"] for e in events.of("daemon_registered")] == [me.id]

    age_heartbeat(conn, me.id, 4)  # so that the next heartbeat's time shows it moved
    service.current = DaemonSnapshot(2, "reloading", (IDLE,))
    assert service.run_once()["registered"] is False
    [again] = client.daemons()
    assert (again["generation"], again["state"], list(again["pools"])) == (2, "reloading",
                                                                          ["reports"])
    assert again["started_at"] == row["started_at"]
    assert again["heartbeat_at"] > row["heartbeat_at"] and again["silent_seconds"] < 1
    assert len(events.of("daemon_registered")) == 1, "a heartbeat is logged only once"


def test_a_silent_daemon_shows_as_lost_past_three_of_its_intervals(registry, client, conn):
    beats = {interval: registry(DaemonSnapshot(1, "running"), interval=interval,
                                daemon=f"host-a:/etc/{interval}.yaml")
             for interval in (5.0, 20.0, 1.0)}
    for service in beats.values():
        service.run_once()
    ids = {interval: service.identity.id for interval, service in beats.items()}
    age_heartbeat(conn, ids[5.0], 14)     # under 3 x 5 s
    age_heartbeat(conn, ids[20.0], 61)    # past 3 x 20 s
    age_heartbeat(conn, ids[1.0], REGISTRY_LOST_FLOOR - 1)  # past 3 x 1 s, not the floor
    states = {row["id"]: (row["state"], row["reported_state"]) for row in client.daemons()}
    assert states == {ids[5.0]: ("running", "running"), ids[20.0]: ("lost", "running"),
                      ids[1.0]: ("running", "running")}

    age_heartbeat(conn, ids[5.0], 16)
    age_heartbeat(conn, ids[1.0], REGISTRY_LOST_FLOOR + 1)
    lost = client.daemons(state="LOST")
    assert {row["id"] for row in lost} == {ids[5.0], ids[20.0], ids[1.0]}
    # The running ones come first: a lost one is listed after them.
    beats[5.0].run_once()
    assert [row["id"] for row in client.daemons()][0] == ids[5.0]
    assert client.daemons(state="running")[0]["silent_seconds"] < 1


def test_a_stopped_daemon_signs_off_and_is_never_lost(registry, client, conn):
    service = registry(DaemonSnapshot(1, "running", (WORKING,)), interval=1.0)
    service.start()
    wait_until(lambda: client.daemons(), 10, message="the first heartbeat")
    service.current = DaemonSnapshot(1, "stopping", (WORKING,))
    service.wake()
    wait_until(lambda: client.daemons()[0]["state"] == "stopping", 10,
               message="the stopping state, written at once on wake()")
    service.stop()
    [row] = client.daemons()
    assert (row["state"], row["reported_state"], row["pools"]) == ("stopped", "stopped", {})
    age_heartbeat(conn, service.identity.id, 3600)
    assert client.daemons()[0]["state"] == "stopped"


def test_rows_silent_for_a_day_are_pruned_by_any_daemon(registry, client, conn, events):
    old = registry(DaemonSnapshot(1, "running"), daemon="host-b:/etc/old.yaml")
    recent = registry(DaemonSnapshot(1, "running"), daemon="host-b:/etc/recent.yaml")
    for service in (old, recent):
        service.run_once()
    age_heartbeat(conn, old.identity.id, REGISTRY_KEPT_SECONDS + 60)
    age_heartbeat(conn, recent.identity.id, REGISTRY_KEPT_SECONDS - 60)
    pruner = registry(DaemonSnapshot(1, "running"))
    assert pruner.run_once()["pruned"] == 1
    assert {row["id"] for row in client.daemons()} == {recent.identity.id,
                                                      pruner.identity.id}
    assert events.of("daemons_pruned") == [{"rows": 1, "silent_seconds": REGISTRY_KEPT_SECONDS}]
    # Pruning is hourly, not per heartbeat.
    age_heartbeat(conn, recent.identity.id, REGISTRY_KEPT_SECONDS + 60)
    assert pruner.run_once()["pruned"] == 0
    assert len(client.daemons()) == 2


def test_the_identity_is_the_host_config_and_process():
    config = parse_config({}, base_dir=Path.cwd(), env={})
    first = DaemonIdentity.of(config, daemon_identity(config))
    second = DaemonIdentity.of(config, daemon_identity(config))
    assert (first.host, first.pid, first.version) == (socket.gethostname(), os.getpid(),
                                                       __version__)
    assert first.daemon == second.daemon and first.id != second.id


@pytest.mark.parametrize("kwargs, message", [
    ({"state": "asleep"}, "state: unknown daemon state 'asleep' (one of: starting, running, "
                          "reloading, stopping, stopped, lost)"),
    ({"state": 3}, "state: unknown daemon state 3"),
    ({"limit": 0}, "limit: must be 1 or more, got 0"),
    ({"limit": 10_001}, "limit: must be at most 10000"),
])
def test_bad_arguments_are_refused_before_the_database(kwargs, message):
    client = Client("postgresql://nobody@127.0.0.1:1/none")  # never reached
    with pytest.raises(UsageError) as info:
        client.daemons(**kwargs)
    assert str(info.value).startswith(message)
