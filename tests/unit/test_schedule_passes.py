"""What a scheduler pass enqueues: on-time instants, catch-up after downtime, fresh starts.
Every instant is passed in; nothing reads a clock or a database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from supervisor.config import ScheduleConfig
from supervisor.scheduling.cron import Cron
from supervisor.scheduling.passes import (CLOCK_TOLERANCE, ON_TIME_GRACE, ScheduleState,
                                         next_instant, plan_pass)

UTC = timezone.utc
HOUR = timedelta(hours=1)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def schedule(cron: str = "0 * * * *", zone: str = "UTC", **fields) -> ScheduleConfig:
    return ScheduleConfig(name=fields.pop("name", "s"), cron=Cron(cron, zone),
                          task_type="echo", **fields)


def state(s: ScheduleConfig, through: datetime, last: datetime | None = None) -> ScheduleState:
    return ScheduleState(s.cron.expression, s.cron.timezone, through, last)


def hours(plan) -> list[str]:
    return [i.strftime("%d %H:%M:%S") for i in plan.instants]


class TestOnTime:
    def test_an_instant_that_just_came_due_is_enqueued_and_moves_through(self):
        s = schedule()
        plan = plan_pass(s, state(s, at("2026-01-01T10:00:00")), at("2026-01-01T11:00:00.02"))
        assert hours(plan) == ["01 11:00:00"]
        assert (plan.through, plan.missed, plan.started, plan.save) == (
            at("2026-01-01T11:00:00"), 0, False, True)

    def test_nothing_due_changes_nothing(self):
        s = schedule()
        plan = plan_pass(s, state(s, at("2026-01-01T10:00:00")), at("2026-01-01T10:59:59"))
        assert (plan.instants, plan.through, plan.save) == ((), at("2026-01-01T10:00:00"), False)

    @pytest.mark.parametrize("policy", ["all", "latest", "skip"])
    def test_every_instant_of_a_late_pass_within_the_grace_is_enqueued(self, policy):
        """A slow database held the pass up for 8 seconds: eight instants of a schedule that
        runs every second are on time, whatever the policy."""
        s = schedule("* * * * * *", catch_up=policy)
        plan = plan_pass(s, state(s, at("2026-01-01T10:00:00")), at("2026-01-01T10:00:08"))
        assert len(plan.instants) == 8 and plan.missed == 0

    def test_the_task_of_an_instant_is_due_at_it_and_named_by_it(self):
        s = schedule(name="report", payload={"kind": "sales"}, priority=5, max_retries=1)
        plan = plan_pass(s, state(s, at("2026-01-01T10:00:00")), at("2026-01-01T11:00:00"))
        assert list(plan.tasks()) == [{
            "task_type": "echo", "payload": {"kind": "sales"}, "priority": 5, "max_retries": 1,
            "name": "report", "task_id": "schedule:report:2026-01-01T11:00:00Z",
            "run_at": at("2026-01-01T11:00:00")}]
        assert plan.state() == ScheduleState("0 * * * *", "UTC", at("2026-01-01T11:00:00"),
                                             at("2026-01-01T11:00:00"))


class TestCatchUp:
    """The daemons were all down from 10:00:30 to 15:20: 11:00 to 15:00 were missed."""

    THROUGH = at("2026-01-01T10:00:00")
    NOW = at("2026-01-01T15:20:00")

    def plan(self, **fields):
        s = schedule(**fields)
        return plan_pass(s, state(s, self.THROUGH), self.NOW)

    def test_latest_enqueues_only_the_most_recent_missed_instant(self):
        plan = self.plan(catch_up="latest")
        assert hours(plan) == ["01 15:00:00"]
        assert (plan.missed, plan.caught_up, plan.through) == (2, 1, at("2026-01-01T15:00:00"))

    def test_all_enqueues_every_missed_instant_oldest_first(self):
        plan = self.plan(catch_up="all")
        assert hours(plan) == ["01 11:00:00", "01 12:00:00", "01 13:00:00", "01 14:00:00",
                               "01 15:00:00"]
        assert (plan.missed, plan.caught_up) == (5, 5)

    def test_all_keeps_the_newest_max_catch_up_and_passes_over_the_rest(self):
        plan = self.plan(catch_up="all", max_catch_up=2)
        assert hours(plan) == ["01 14:00:00", "01 15:00:00"]
        assert (plan.missed, plan.caught_up, plan.through) == (3, 2, at("2026-01-01T15:00:00"))

    def test_skip_enqueues_none_and_moves_past_them(self):
        plan = self.plan(catch_up="skip")
        assert (plan.instants, plan.missed, plan.caught_up, plan.save) == ((), 1, 0, True)
        assert plan.through == at("2026-01-01T15:00:00")

    def test_skip_still_enqueues_what_is_due_now(self):
        s = schedule(catch_up="skip")
        plan = plan_pass(s, state(s, self.THROUGH), at("2026-01-01T15:00:03"))
        assert hours(plan) == ["01 15:00:00"]

    def test_latest_runs_the_missed_one_and_the_one_due_now(self):
        """Each instant is its own run (a report for 14:00 is not the one for 15:00)."""
        s = schedule(catch_up="latest")
        plan = plan_pass(s, state(s, self.THROUGH), at("2026-01-01T15:00:03"))
        assert hours(plan) == ["01 14:00:00", "01 15:00:00"]
        assert (plan.missed, plan.caught_up) == (2, 1)

    def test_a_month_missed_every_second_costs_what_the_policy_keeps(self):
        s = schedule("* * * * * *", catch_up="all", max_catch_up=3)
        plan = plan_pass(s, state(s, at("2026-01-01T00:00:00")), at("2026-02-01T00:00:00"))
        # The three newest missed ones, then the eleven on-time seconds (now - 10 s to now).
        assert len(plan.instants) == 3 + 11 and plan.caught_up == 3
        assert plan.instants[2] == at("2026-02-01T00:00:00") - ON_TIME_GRACE - timedelta(seconds=1)
        assert plan.through == at("2026-02-01T00:00:00")

    def test_what_the_grace_spares_is_on_time_and_what_is_older_is_missed(self):
        s = schedule("* * * * * *", catch_up="skip")
        now = at("2026-01-01T10:01:00")
        plan = plan_pass(s, state(s, at("2026-01-01T10:00:00")), now)
        assert plan.instants[0] == now - ON_TIME_GRACE
        assert plan.instants[-1] == now and len(plan.instants) == 11


    @pytest.mark.parametrize("policy", ["skip", "latest", "all"])
    def test_an_instant_is_on_time_up_to_the_tolerance_and_missed_past_it(self, policy):
        """The one definition: on time while now - instant <= ON_TIME_GRACE; only a later
        instant is missed, and only a missed one is the catch-up policy's to drop."""
        s = schedule("0 * * * *", catch_up=policy)
        through = at("2026-01-01T10:00:00")
        on_time = plan_pass(s, state(s, through), at("2026-01-01T11:00:00") + ON_TIME_GRACE)
        assert (hours(on_time), on_time.missed) == (["01 11:00:00"], 0)
        late = plan_pass(s, state(s, through),
                         at("2026-01-01T11:00:00") + ON_TIME_GRACE + timedelta(milliseconds=1))
        assert late.missed == 1 and late.through == at("2026-01-01T11:00:00")
        assert hours(late) == ([] if policy == "skip" else ["01 11:00:00"])


class TestFreshStart:
    def test_a_new_schedule_does_not_catch_up_on_its_past(self):
        s = schedule(catch_up="all")
        plan = plan_pass(s, None, at("2026-01-01T10:30:00"))
        assert (plan.instants, plan.started, plan.save) == ((), True, True)
        assert plan.through == at("2026-01-01T10:30:00")

    def test_a_new_schedule_starts_at_the_first_instant_after_it_existed(self):
        """Not at one within the tolerance before: that instant was never this schedule's."""
        s = schedule("* * * * * *", catch_up="all")
        plan = plan_pass(s, None, at("2026-01-01T11:00:01"))
        assert (plan.instants, plan.started, plan.through) == (
            (), True, at("2026-01-01T11:00:01"))
        again = plan_pass(s, plan.state(), at("2026-01-01T11:00:02.5"))
        assert hours(again) == ["01 11:00:02"]

    def test_a_changed_cron_starts_afresh_instead_of_catching_up(self):
        old = schedule("0 3 * * *", catch_up="all")
        new = schedule("*/5 * * * *", catch_up="all")
        plan = plan_pass(new, state(old, at("2026-01-01T03:00:00")), at("2026-01-01T12:31:00"))
        assert (plan.instants, plan.started, plan.missed) == ((), True, 0)
        again = plan_pass(new, plan.state(), at("2026-01-01T12:35:00"))
        assert hours(again) == ["01 12:35:00"] and not again.started

    def test_a_changed_zone_starts_afresh(self):
        old = schedule("0 9 * * *")
        new = schedule("0 9 * * *", "Europe/Paris")
        plan = plan_pass(new, state(old, at("2026-01-01T09:00:00")), at("2026-01-03T12:00:00"))
        assert plan.started and plan.instants == ()

    def test_a_changed_policy_or_payload_keeps_the_state(self):
        old = schedule(catch_up="skip")
        new = schedule(catch_up="all", payload={"v": 2})
        plan = plan_pass(new, state(old, at("2026-01-01T10:00:00")), at("2026-01-01T12:30:00"))
        assert not plan.started and hours(plan) == ["01 11:00:00", "01 12:00:00"]


class TestThroughAheadOfTheClock:
    """The saved through is ahead of the database's clock: the clock was set back after a
    pass, or the row was written by plain SQL."""

    def test_within_a_period_and_the_tolerance_the_pass_waits_for_the_clock(self):
        s = schedule("0 * * * *", catch_up="all")
        saved = at("2026-01-01T11:00:00")
        # The clock went back 65 minutes: one period of the cron plus the tolerance.
        now = saved - HOUR - CLOCK_TOLERANCE
        plan = plan_pass(s, state(s, saved), now)
        assert (plan.instants, plan.through, plan.save, plan.ahead, plan.reanchored) == (
            (), saved, False, saved, None)
        # 11:00 was enqueued before the clock went back: it is not again; 12:00 is.
        plan = plan_pass(s, state(s, saved), at("2026-01-01T11:00:00"))
        assert (plan.instants, plan.ahead) == ((), None)
        assert hours(plan_pass(s, state(s, saved), at("2026-01-01T12:00:00"))) == ["01 12:00:00"]

    @pytest.mark.parametrize("saved", [at("2026-01-01T11:05:01"), datetime.max.replace(
        tzinfo=UTC)])
    def test_further_ahead_it_is_taken_as_corrupt_and_starts_again_at_now(self, saved):
        s = schedule("0 * * * *", catch_up="all")
        now = at("2026-01-01T10:00:00")
        plan = plan_pass(s, state(s, saved), now)
        assert (plan.instants, plan.through, plan.save, plan.ahead, plan.reanchored) == (
            (), now, True, None, saved)
        assert not plan.started
        assert hours(plan_pass(s, plan.state(), at("2026-01-01T11:00:00"))) == ["01 11:00:00"]

    def test_the_tolerance_is_the_floor_for_a_schedule_every_second(self):
        s = schedule("* * * * * *")
        now = at("2026-01-01T10:00:00")
        assert plan_pass(s, state(s, now + CLOCK_TOLERANCE), now).ahead == now + CLOCK_TOLERANCE
        late = now + CLOCK_TOLERANCE + 2 * timedelta(seconds=1)
        assert plan_pass(s, state(s, late), now).reanchored == late


class TestDaylightSaving:
    """New York, 2026: 02:30 does not exist on March 8, 01:30 happens twice on November 1."""

    @pytest.mark.parametrize("policy", ["all", "latest"])
    def test_a_pass_over_the_spring_forward_night_runs_the_skipped_time_once(self, policy):
        s = schedule("30 2 * * *", "America/New_York", catch_up=policy)
        plan = plan_pass(s, state(s, at("2026-03-07T12:00:00")), at("2026-03-08T12:00:00"))
        assert plan.instants == (at("2026-03-08T07:00:00"),)  # 03:00 EDT

    def test_passes_through_the_fall_back_night_run_the_repeated_time_once(self):
        s = schedule("30 1 * * *", "America/New_York")
        current = state(s, at("2026-10-31T12:00:00"))
        enqueued = []
        # A pass every ten minutes through the night, as a running daemon would make.
        for minute in range(0, 8 * 60, 10):
            plan = plan_pass(s, current, at("2026-11-01T03:00:00") + timedelta(minutes=minute))
            enqueued += plan.instants
            current = plan.state() if plan.save else current
        assert enqueued == [at("2026-11-01T05:30:00")]  # 01:30 EDT, not 01:30 EST

    def test_the_next_instant_of_several_schedules_is_the_earliest(self):
        nightly = schedule("30 2 * * *", "America/New_York")
        hourly = schedule("45 * * * *", name="h")
        assert next_instant([nightly, hourly], at("2026-03-08T06:20:00")) == \
            at("2026-03-08T06:45:00")
        assert next_instant([nightly, hourly], at("2026-03-08T06:50:00")) == \
            at("2026-03-08T07:00:00")
        assert next_instant([hourly], at("2026-03-08T06:50:00")) == at("2026-03-08T06:45:00") + HOUR
        assert next_instant([], at("2026-03-08T06:20:00")) is None

    def test_a_schedule_with_no_instant_ahead_plans_nothing_and_waits_for_none(self):
        """Every instant in New York's skipped hour (as a tzdata update could make a loaded
        schedule): the pass and the wait get the search's bounded None, not an overflow."""
        never = schedule("* 2 * 3 0#2", "America/New_York", name="never")
        now = at("2026-03-08T07:30:00")
        plan = plan_pass(never, state(never, now - 30 * 86400 * timedelta(seconds=1)), now)
        assert (plan.instants, plan.missed) == ((), 0)
        assert next_instant([never], now) is None
