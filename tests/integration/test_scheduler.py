"""The scheduler on a real PostgreSQL: one task per instant however many daemons enqueue it,
catch-up after downtime, reloads, and the state that outlives deleted tasks.

Passes are given their ``now`` (the database's clock cannot be moved), so a test walks a
schedule through hours or years in milliseconds; one test runs the thread in real time.
"""

from __future__ import annotations

import threading
import tracemalloc
from datetime import datetime, timedelta, timezone

import pytest

from conftest import make_config, wait_until
from supervisor import Client
from supervisor.db import schedule_states, store
from supervisor.errors import OperationalError, UsageError
from supervisor.maintenance.scheduler import MAX_INSERT_BYTES, MAX_INSERT_TASKS, Scheduler
from supervisor.scheduling.definitions import TAKEOVER_AFTER, definition_of
from supervisor.scheduling.passes import ON_TIME_GRACE

pytest_plugins = ["worker_fixtures"]

UTC = timezone.utc
SECOND = timedelta(seconds=1)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def schedules(dsn: str, **definitions):
    """ScheduleConfigs, read from YAML-shaped definitions the way the daemon reads them."""
    return make_config(dsn, schedules=definitions).schedules


def scheduled(conn, name: str | None = None) -> dict[str, dict]:
    """Task id -> row of every scheduled task (of one schedule), oldest instant first."""
    rows = conn.execute(
        "SELECT id, name, task_type, payload, priority, max_retries, status, scheduled_time "
        "FROM tasks WHERE id LIKE %s ORDER BY scheduled_time",
        (f"schedule:{name or ''}%",)).fetchall()
    return {row[0]: dict(zip(("id", "name", "task_type", "payload", "priority", "max_retries",
                              "status", "scheduled_time"), row)) for row in rows}


def state_of(conn, name: str) -> dict | None:
    with conn.transaction():
        return schedule_states.lock_schedule_states(conn, [name]).get(name)


@pytest.fixture
def scheduler(db_dsn):
    """Build Schedulers (each a "daemon") on the test database; threads stopped afterwards."""
    built: list[Scheduler] = []

    def build(*configured, **kwargs) -> Scheduler:
        service = Scheduler(db_dsn, schedules=configured, max_payload_bytes=1 << 20, **kwargs)
        built.append(service)
        return service

    yield build
    for service in built:
        if service.is_alive():
            service.stop(timeout=10)
        service._close()


# -- what a pass writes ---------------------------------------------------------------------


def test_an_instant_becomes_one_task_due_at_it_and_named_by_it(db_dsn, conn, scheduler):
    (report,) = schedules(db_dsn, report={"cron": "0 * * * *", "task_type": "record",
                                          "payload": {"kind": "sales"}, "priority": 7,
                                          "max_retries": 1})
    service = scheduler(report)
    assert service.run_once(now=at("2026-01-01T10:30:00")) == []  # a start: nothing due
    created = service.run_once(now=at("2026-01-01T11:00:00.3"))

    assert created == ["schedule:report:2026-01-01T11:00:00Z"] and created[0].created
    assert list(scheduled(conn).values()) == [{
        "id": "schedule:report:2026-01-01T11:00:00Z", "name": "report", "task_type": "record",
        "payload": {"kind": "sales"}, "priority": 7, "max_retries": 1, "status": "PENDING",
        "scheduled_time": at("2026-01-01T11:00:00")}]
    state = state_of(conn, "report")
    assert (state["cron"], state["timezone"], state["through"], state["last_enqueued"]) == (
        "0 * * * *", "UTC", at("2026-01-01T11:00:00"), at("2026-01-01T11:00:00"))


def test_a_pass_without_now_counts_on_the_databases_clock(db_dsn, conn, scheduler):
    (tick,) = schedules(db_dsn, tick={"cron": "* * * * * *", "task_type": "echo"})
    service = scheduler(tick)
    # A start enqueues nothing from before the schedule existed: at most the instant of a
    # second that began between the row's creation and the pass that followed it.
    assert len(service.run_once()) <= 1
    created_at = state_of(conn, "tick")["created_at"]
    wait_until(lambda: service.run_once(), timeout=5, message="the next second's instant")
    database_now = conn.execute("SELECT now()").fetchone()[0]
    instants = [row["scheduled_time"] for row in scheduled(conn).values()]
    assert created_at < instants[0] and instants[-1] <= database_now


def test_an_instant_someone_enqueued_already_is_left_as_it_is(db_dsn, conn, scheduler):
    (report,) = schedules(db_dsn, report={"cron": "0 * * * *", "task_type": "echo"})
    service = scheduler(report)
    service.run_once(now=at("2026-01-01T10:30:00"))
    conn.execute("INSERT INTO tasks (id, name, task_type, status) VALUES "
                 "('schedule:report:2026-01-01T11:00:00Z', 'by hand', 'echo', 'CANCELLED')")

    assert service.run_once(now=at("2026-01-01T11:00:00")) == []

    row = scheduled(conn)["schedule:report:2026-01-01T11:00:00Z"]
    assert (row["name"], row["status"]) == ("by hand", "CANCELLED")
    assert state_of(conn, "report")["through"] == at("2026-01-01T11:00:00")


# -- many daemons ---------------------------------------------------------------------------


def test_two_daemons_enqueueing_the_same_windows_at_once_make_one_task_per_instant(
        db_dsn, conn, scheduler):
    """Two schedulers pass over the same instants at the same moments, from a start with no
    state (nothing to lock: both insert every task, and ON CONFLICT keeps one) through a
    minute of passes, some of them late."""
    defined = schedules(db_dsn,
                        seconds={"cron": "* * * * * *", "task_type": "echo", "catch_up": "all"},
                        fives={"cron": "*/5 * * * * *", "task_type": "echo"},
                        minutes={"cron": "* * * * *", "task_type": "echo", "catch_up": "skip"})
    daemons = [scheduler(*defined), scheduler(*defined)]
    start = at("2026-01-01T10:00:00")
    # Irregular passes, as timers and slow statements make them; both daemons make each.
    nows = [start + timedelta(seconds=s) for s in
            (0, 0.5, 1, 1.01, 4, 4.7, 5, 9, 13, 13, 14.2, 20, 21, 33, 47, 60, 60.5, 61, 70)]
    created: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    for now in nows:
        barrier = threading.Barrier(2)

        def run(index: int, now=now, barrier=barrier) -> None:
            try:
                barrier.wait(10)
                created[index] += daemons[index].run_once(now=now)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert errors == []

    ids = list(scheduled(conn))
    # Every instant after the first pass (the schedules' creation) through the last, once.
    expected = {f"schedule:seconds:{start + SECOND * s:%Y-%m-%dT%H:%M:%SZ}"
                for s in range(1, 71)}
    expected |= {f"schedule:fives:{start + SECOND * s:%Y-%m-%dT%H:%M:%SZ}"
                 for s in range(5, 71, 5)}
    expected |= {"schedule:minutes:2026-01-01T10:01:00Z"}
    assert sorted(ids) == sorted(expected)
    # Each task was created by exactly one of the two.
    assert sorted(created[0] + created[1]) == sorted(expected)


def test_a_definition_passes_only_to_a_daemon_that_held_it_or_after_nobody_did(
        db_dsn, conn, scheduler, events):
    """Daemons a and b give "s" different payloads. a's, recorded first, keeps it while a
    runs, across a restart of b; once a is gone for TAKEOVER_AFTER, b takes it; a back with
    its old config is kept out; b restarted with a new definition carries the schedule with
    it, having held the recorded one."""
    def hourly(version: int):
        (s,) = schedules(db_dsn, s={"cron": "0 * * * *", "task_type": "echo",
                                    "payload": {"v": version}})
        return s

    def versions() -> list[tuple[str, int]]:
        return [(row["id"][-9:-4], row["payload"]["v"]) for row in scheduled(conn).values()]

    a = scheduler(hourly(1), daemon="host-a:/etc/pgtaskd.yaml")
    b = scheduler(hourly(2), daemon="host-b:/etc/pgtaskd.yaml")
    a.run_once(now=at("2026-01-01T09:59:30"))
    b.run_once(now=at("2026-01-01T09:59:40"))
    (kept_out,) = events.of("schedule_conflict")
    assert kept_out["enqueues"] is False and kept_out["daemons"] == []
    a.run_once(now=at("2026-01-01T10:00:00"))
    assert events.of("schedule_conflict")[-1]["daemons"] == ["host-b:/etc/pgtaskd.yaml"]
    assert b.run_once(now=at("2026-01-01T10:00:00.5")) == []
    b = scheduler(hourly(2), daemon="host-b:/etc/pgtaskd.yaml")  # a restart, same config
    assert b.run_once(now=at("2026-01-01T10:00:01")) == []
    assert versions() == [("10:00", 1)]
    assert len(events.of("schedule_conflict")) == 3  # b's start logged it again, a's did not

    # a stops; an hour later its definition is abandoned, and b's is in force.
    b.run_once(now=at("2026-01-01T11:00:00"))
    (taken,) = events.of("schedule_definition_replaced")
    assert taken["reason"] == "abandoned"
    assert versions() == [("10:00", 1), ("11:00", 2)]

    b.run_once(now=at("2026-01-01T11:30:00"))  # a running daemon passes every minute
    a = scheduler(hourly(1), daemon="host-a:/etc/pgtaskd.yaml")  # back, config unchanged
    assert a.run_once(now=at("2026-01-01T11:30:01")) == []
    b = scheduler(hourly(3), daemon="host-b:/etc/pgtaskd.yaml")  # restarted with a new one
    b.run_once(now=at("2026-01-01T12:00:00"))
    assert a.run_once(now=at("2026-01-01T12:00:01")) == []
    assert events.of("schedule_definition_replaced")[-1]["reason"] == "changed"
    assert versions() == [("10:00", 1), ("11:00", 2), ("12:00", 3)]
    assert state_of(conn, "s")["definition"] == definition_of(hourly(3))


def test_no_value_in_the_shared_rows_stops_a_pass(db_dsn, conn, scheduler):
    """Any login may write the state and the reports: times no datetime holds and odd
    definitions are read as what they are, and the other schedules go on."""
    one, two = schedules(db_dsn, one={"cron": "0 * * * *", "task_type": "echo"},
                         two={"cron": "0 * * * *", "task_type": "echo"})
    service = scheduler(one, two, daemon="me")
    service.run_once(now=at("2026-01-01T09:59:00"))
    conn.execute("UPDATE pgtaskd_schedule_state SET through = 'infinity', "
                 "updated_at = '-infinity' WHERE name = 'one'")
    conn.execute("INSERT INTO pgtaskd_schedule_daemons VALUES ('one', 'x', '', 'infinity'), "
                 "('two', 'y', repeat('z', 10000), '-infinity')")
    assert service.run_once(now=at("2026-01-01T10:00:00")) == [
        "schedule:two:2026-01-01T10:00:00Z"]
    # one started afresh from that pass, and runs from its next instant on.
    assert service.run_once(now=at("2026-01-01T11:00:00")) == [
        "schedule:one:2026-01-01T11:00:00Z", "schedule:two:2026-01-01T11:00:00Z"]


def test_a_through_ahead_of_the_database_clock_is_waited_for_or_reset_and_said_once(
        db_dsn, conn, scheduler, events):
    """The clock went back 40 minutes after an hourly schedule's 11:00 pass: it waits for
    the clock, saying so once. Another's through was set to the year 9999 by plain SQL: it
    starts again at the clock, saying so."""
    hourly, far = schedules(db_dsn, hourly={"cron": "0 * * * *", "task_type": "echo"},
                            far={"cron": "0 * * * *", "task_type": "echo"})
    service = scheduler(hourly, far)
    service.run_once(now=at("2026-01-01T09:30:00"))
    conn.execute("UPDATE pgtaskd_schedule_state SET through = CASE name "
                 "WHEN 'hourly' THEN '2026-01-01T11:00:00Z'::timestamptz "
                 "ELSE '9999-12-31T00:00:00Z' END")

    assert service.run_once(now=at("2026-01-01T10:20:00")) == []
    assert service.run_once(now=at("2026-01-01T10:50:00")) == []

    (ahead,) = events.of("schedule_ahead_of_clock")
    assert (ahead["schedule"], ahead["through"], ahead["database_now"]) == (
        "hourly", "2026-01-01T11:00:00+00:00", "2026-01-01T10:20:00+00:00")
    assert "waits" in ahead["action"]
    (reset,) = events.of("schedule_reanchored")
    assert (reset["schedule"], reset["through"], reset["database_now"]) == (
        "far", "9999-12-31T00:00:00+00:00", "2026-01-01T10:20:00+00:00")
    assert state_of(conn, "far")["through"] == at("2026-01-01T10:20:00")
    assert state_of(conn, "hourly")["through"] == at("2026-01-01T11:00:00")

    # 11:00 was enqueued before the clock went back: hourly's next task is 12:00's.
    assert service.run_once(now=at("2026-01-01T11:00:00.2")) == [
        "schedule:far:2026-01-01T11:00:00Z"]
    assert events.of("schedule_clock_caught_up")[0]["schedule"] == "hourly"
    assert service.run_once(now=at("2026-01-01T12:00:00.2")) == [
        "schedule:far:2026-01-01T12:00:00Z", "schedule:hourly:2026-01-01T12:00:00Z"]
    assert len(events.of("schedule_ahead_of_clock")) == 1


@pytest.mark.parametrize("policy, expected", [
    ("latest", ["15:00"]),
    ("all", ["11:00", "12:00", "13:00", "14:00", "15:00"]),
    ("skip", []),
])
def test_after_downtime_the_missed_instants_follow_the_policy(db_dsn, conn, scheduler, events,
                                                              policy, expected):
    (hourly,) = schedules(db_dsn, hourly={"cron": "0 * * * *", "task_type": "echo",
                                          "catch_up": policy})
    first = scheduler(hourly)
    first.run_once(now=at("2026-01-01T09:59:30"))
    first.run_once(now=at("2026-01-01T10:00:00"))
    assert list(scheduled(conn)) == ["schedule:hourly:2026-01-01T10:00:00Z"]

    # Every daemon was down from 10:00:30 to 15:20. The next daemon up is another one.
    scheduler(hourly).run_once(now=at("2026-01-01T15:20:00"))

    assert [i[-9:-4] for i in scheduled(conn)][1:] == expected
    assert state_of(conn, "hourly")["through"] == at("2026-01-01T15:00:00")
    (missed,) = events.of("schedule_missed")
    assert (missed["schedule"], missed["catch_up"], missed["caught_up"]) == (
        "hourly", policy, len(expected))


def test_all_catches_up_at_most_max_catch_up_of_a_long_outage(db_dsn, conn, scheduler):
    (tick,) = schedules(db_dsn, tick={"cron": "* * * * * *", "task_type": "echo",
                                      "catch_up": "all", "max_catch_up": 5})
    scheduler(tick).run_once(now=at("2026-01-01T00:00:00"))
    before = len(scheduled(conn))
    scheduler(tick).run_once(now=at("2027-01-01T00:00:00"))  # a year of seconds missed

    ids = list(scheduled(conn))[before:]
    # The five newest missed, then the on-time ones: now - 10 s to now, both ends included.
    assert len(ids) == 5 + ON_TIME_GRACE.total_seconds() + 1
    assert ids[0] == "schedule:tick:2026-12-31T23:59:45Z"
    assert ids[-1] == "schedule:tick:2027-01-01T00:00:00Z"


def test_a_catch_up_of_ten_thousand_large_tasks_goes_in_bounded_statements_all_or_none(
        db_dsn, conn, scheduler, monkeypatch):
    """10,000 missed instants of a 20 KB payload: the pass inserts them in statements of
    bounded count and size, so its memory peak is a few such statements, not the whole
    catch-up (one statement of 200 MB of JSON peaked at 585 MiB here), and it keeps nothing
    after. The statements share the pass's transaction: a pass whose connection dies after
    some of them leaves nothing, and the next one inserts every instant, each once."""
    (bulk,) = schedules(db_dsn, bulk={"cron": "* * * * * *", "task_type": "echo",
                                      "payload": {"blob": "x" * 20_000}, "catch_up": "all",
                                      "max_catch_up": 10_000})
    service = scheduler(bulk)
    start, now = at("2026-01-01T00:00:00"), at("2026-01-01T06:00:00")
    service.run_once(now=start)
    statements: list[tuple[int, int]] = []  # (tasks, bytes) of each insert
    cut_before = 3
    submit_tasks = store.submit_tasks

    def recording(scheduler_conn, tasks_json):
        if len(statements) == cut_before:  # the daemon dies mid-catch-up
            conn.execute("SELECT pg_terminate_backend(%s)", (scheduler_conn.info.backend_pid,))
        statements.append((tasks_json.count('"task_type":'), len(tasks_json.encode())))
        return submit_tasks(scheduler_conn, tasks_json)

    monkeypatch.setattr(store, "submit_tasks", recording)
    with pytest.raises(OperationalError, match="lost the connection"):
        service.run_once(now=now)
    assert scheduled(conn, "bulk") == {} and state_of(conn, "bulk")["through"] == start

    service._close()
    statements.clear()
    cut_before = None
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        created = service.run_once(now=now)
        kept = tracemalloc.get_traced_memory()[0] - before
        del created[:]  # the ids this pass returns, about 5 MB of them
        returned = tracemalloc.get_traced_memory()[0] - before
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()

    assert peak < 32 << 20, f"peak {peak >> 20} MiB"
    assert returned < 1 << 20, f"{returned >> 10} KiB kept after the pass ({kept >> 10} KiB)"
    assert max(tasks for tasks, _ in statements) <= MAX_INSERT_TASKS
    assert max(size for _, size in statements) <= MAX_INSERT_BYTES
    # The 10,000 newest missed instants and the 11 on time, each once.
    expected = [f"schedule:bulk:{now - SECOND * s:%Y-%m-%dT%H:%M:%SZ}"
                for s in range(10_000 + int(ON_TIME_GRACE.total_seconds()), -1, -1)]
    assert sum(tasks for tasks, _ in statements) == len(expected) == 10_011
    assert [row[0] for row in conn.execute(
        "SELECT id FROM tasks WHERE id LIKE 'schedule:bulk:%' ORDER BY id")] == expected
    assert state_of(conn, "bulk")["through"] == now


def test_what_was_enqueued_is_remembered_after_its_task_is_deleted(db_dsn, conn, scheduler):
    """Retention deletes finished tasks; the state still says the instant was handled, so a
    restart does not run it again."""
    (daily,) = schedules(db_dsn, daily={"cron": "0 3 * * *", "task_type": "echo",
                                        "catch_up": "latest"})
    scheduler(daily).run_once(now=at("2026-01-01T02:00:00"))
    scheduler(daily).run_once(now=at("2026-01-01T03:00:00"))
    conn.execute("DELETE FROM tasks")

    # Restarted at 04:00 the same day: 03:00 ran already, nothing was missed.
    assert scheduler(daily).run_once(now=at("2026-01-01T04:00:00")) == []
    assert scheduled(conn) == {}


def test_a_spring_forward_night_enqueues_the_skipped_time_once(db_dsn, conn, scheduler):
    (nightly,) = schedules(db_dsn, nightly={"cron": "30 2 * * *", "task_type": "echo",
                                            "timezone": "America/New_York",
                                            "catch_up": "all"})
    service = scheduler(nightly)
    service.run_once(now=at("2026-03-06T12:00:00"))
    for hour in range(0, 72, 1):  # a pass every hour for three days
        service.run_once(now=at("2026-03-06T12:00:00") + timedelta(hours=hour))
    assert list(scheduled(conn)) == ["schedule:nightly:2026-03-07T07:30:00Z",
                                     "schedule:nightly:2026-03-08T07:00:00Z",
                                     "schedule:nightly:2026-03-09T06:30:00Z"]


# -- reloads --------------------------------------------------------------------------------


def test_a_removed_schedule_stops_and_its_tasks_stay(db_dsn, conn, scheduler, events):
    kept, removed = schedules(db_dsn, kept={"cron": "0 * * * *", "task_type": "echo"},
                              removed={"cron": "30 * * * *", "task_type": "echo"})
    service = scheduler(kept, removed)
    service.run_once(now=at("2026-01-01T09:59:00"))
    service.run_once(now=at("2026-01-01T10:00:00"))
    service.run_once(now=at("2026-01-01T10:30:00"))

    service.apply([kept], frozenset(), 1 << 20)
    service.run_once(now=at("2026-01-01T11:00:00"))
    service.run_once(now=at("2026-01-01T11:30:00"))

    assert list(scheduled(conn)) == ["schedule:kept:2026-01-01T10:00:00Z",
                                     "schedule:removed:2026-01-01T10:30:00Z",
                                     "schedule:kept:2026-01-01T11:00:00Z"]
    assert events.of("schedules_applied")[0]["schedules"] == ["kept"]


def test_a_changed_cron_takes_effect_at_once_without_catching_up(db_dsn, conn, scheduler):
    (before,) = schedules(db_dsn, s={"cron": "0 3 * * *", "task_type": "echo",
                                     "catch_up": "all"})
    (after,) = schedules(db_dsn, s={"cron": "*/15 * * * *", "task_type": "echo",
                                    "catch_up": "all"})
    service = scheduler(before)
    service.run_once(now=at("2026-01-01T03:00:00"))

    service.apply([after], frozenset(), 1 << 20)
    # The new expression's instants since 03:00 were never in force: none is caught up.
    assert service.run_once(now=at("2026-01-01T12:05:00")) == []
    assert service.run_once(now=at("2026-01-01T12:15:00")) == ["schedule:s:2026-01-01T12:15:00Z"]
    assert state_of(conn, "s")["cron"] == "*/15 * * * *"


def test_a_daemon_without_schedules_never_connects(db_dsn, conn, scheduler):
    service = scheduler()
    service.tick()
    assert service._conn._conn is None
    assert service.next_wait() == 60.0


def test_the_thread_enqueues_at_each_instant_and_a_reload_wakes_it(db_dsn, conn, scheduler,
                                                                   events):
    """Real time: a schedule every second; then a reload removes it and adds another."""
    tick, tock = schedules(db_dsn, tick={"cron": "* * * * * *", "task_type": "echo"},
                           tock={"cron": "* * * * * *", "task_type": "echo"})
    counted: list[tuple[str, int]] = []
    service = scheduler(tick, on_enqueued=lambda name, n: counted.append((name, n)))
    service.start()
    wait_until(lambda: len(scheduled(conn, "tick")) >= 3, timeout=15,
               message="three instants of tick")

    service.apply([tock], frozenset(), 1 << 20)
    # The reload's pass comes at once, not at the end of a wait.
    wait_until(lambda: events.of("schedules_applied") and scheduled(conn, "tock"), timeout=5,
               message="tock's first task")
    applied_at = conn.execute("SELECT now()").fetchone()[0]
    wait_until(lambda: any(row["scheduled_time"] >= applied_at + 2 * SECOND
                           for row in scheduled(conn, "tock").values()), timeout=15,
               message="tock two seconds after the reload")
    service.stop(timeout=10)

    ticks = [row["scheduled_time"] for row in scheduled(conn, "tick").values()]
    # A pass that began before the reload may finish with an instant at most a second late.
    assert max(ticks) <= applied_at + SECOND
    # One second apart, none missing.
    assert all(b - a == SECOND for a, b in zip(ticks, ticks[1:]))
    assert sum(n for name, n in counted if name == "tick") == len(ticks)


# -- the client ------------------------------------------------------------------------------


def test_schedule_status_says_when_each_ran_and_runs_next(db_dsn, conn, scheduler):
    daily, hourly, never = schedules(
        db_dsn, daily={"cron": "0 3 * * *", "task_type": "echo"},
        hourly={"cron": "0 * * * *", "task_type": "record", "timezone": "Europe/Paris"},
        never={"cron": "0 0 1 1 *", "task_type": "echo"})
    # Make the state of the last hour, by the database's clock.
    now = conn.execute("SELECT now()").fetchone()[0].astimezone(UTC)
    service = scheduler(daily, hourly)
    service.run_once(now=now - timedelta(hours=2))
    service.run_once(now=now)
    last_hour = now.replace(minute=0, second=0, microsecond=0)
    conn.execute("UPDATE tasks SET status = 'COMPLETED' WHERE id = %s",
                 (f"schedule:hourly:{last_hour:%Y-%m-%dT%H:%M:%SZ}",))

    with Client(db_dsn) as client:
        status = {s["name"]: s for s in client.schedule_status([daily, hourly, never])}

    assert status["hourly"].pop("database_now") >= now
    assert status["hourly"] == {
        "name": "hourly", "cron": "0 * * * *", "timezone": "Europe/Paris",
        "task_type": "record", "catch_up": "latest",
        "next_run": last_hour + timedelta(hours=1), "last_run": last_hour,
        "last_task_id": f"schedule:hourly:{last_hour:%Y-%m-%dT%H:%M:%SZ}",
        "last_status": "COMPLETED", "definition": definition_of(hourly),
        "recorded_definition": definition_of(hourly), "conflict": False, "disagreeing": [],
        "through": last_hour, "clock": None}
    assert status["never"]["last_run"] is None and status["never"]["last_status"] is None
    assert status["never"]["next_run"].month == 1 and status["never"]["next_run"].day == 1
    with Client(db_dsn) as client, pytest.raises(UsageError, match="from_config"):
        client.schedule_status()


def test_a_failed_pass_is_logged_once_and_the_next_comes_soon(db_dsn, events):
    (tick,) = schedules(db_dsn, tick={"cron": "* * * * * *", "task_type": "echo"})
    # Nothing listens on port 1: every pass fails to connect.
    service = Scheduler("postgresql://pgtaskd@127.0.0.1:1/none", schedules=[tick],
                        max_payload_bytes=1 << 20, connect_timeout=1)
    service.tick()
    service.tick()
    assert service.next_wait() == 1.0
    (failing,) = events.of("scheduler_failing")
    assert "127.0.0.1:1" in failing["error"]
