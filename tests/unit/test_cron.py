"""Cron expressions in a time zone: parsing, seconds, and daylight saving, with the instants
passed in (no clock is read)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.scheduling.cron import Cron, CronError, check_expression, load_zone

UTC = timezone.utc
# 2026 dates: New York springs forward on March 8 (02:00 EST -> 03:00 EDT, 07:00Z) and falls
# back on November 1 (02:00 EDT -> 01:00 EST, 06:00Z). In Lord Howe the clock moves by 30
# minutes; in Samoa, December 30, 2011 never happened.


def at(text: str) -> datetime:
    """An instant written in UTC, as '2026-03-08T07:00:00'."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def utc(instants: list[datetime]) -> list[str]:
    return [i.strftime("%Y-%m-%dT%H:%M:%S") for i in instants]


class TestParsing:
    @pytest.mark.parametrize("expression, text", [
        ("30 2 * * *", "30 2 * * *"),
        ("  0   9 * * 1-5 ", "0 9 * * 1-5"),
        ("*/10 * * * * *", "*/10 * * * * *"),
        ("@daily", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
        ("0 0 L * *", "0 0 L * *"),
        ("0 0 * * MON#1", "0 0 * * MON#1"),
    ])
    def test_an_expression_is_read(self, expression, text):
        assert check_expression(expression) == text

    @pytest.mark.parametrize("expression, fragment", [
        ("61 * * * *", "bad minute field"),
        ("* 24 * * *", "bad hour field"),
        ("* * * *", "has 4 fields"),
        ("* * * * * * *", "has 7 fields"),
        ("", "has 0 fields"),
        ("60 * * * * *", "bad second field"),
        ("*/0 * * * *", "bad minute field"),
        ("0 0 31 2 *", "bad day-of-month field"),
        ("@reboot", "has 1 fields"),
        ("1-", "has 1 fields"),
        ("x" * 500, "longer than 200"),
        (5, "must be a string"),
    ])
    def test_a_bad_expression_says_why(self, expression, fragment):
        with pytest.raises(CronError, match=fragment):
            check_expression(expression)

    @pytest.mark.parametrize("name", ["Mars/Olympus", "America", "../../etc/passwd", "", None,
                                      "/usr/share/zoneinfo/UTC"])
    def test_an_unknown_zone_is_refused(self, name):
        with pytest.raises(CronError):
            load_zone(name)

    def test_a_cron_is_compared_by_its_text_and_zone(self):
        assert Cron("0 * * * *", "Europe/Paris") == Cron("0 * * * *", "Europe/Paris")
        assert Cron("0 * * * *") != Cron("0 * * * *", "Europe/Paris")
        with pytest.raises(CronError):
            Cron("0 * * * *", "Nowhere/Land")


class TestInstants:
    def test_five_fields_run_on_the_minute_six_on_the_second(self):
        assert Cron("*/20 * * * *").next_after(at("2026-01-01T10:05:00")) == \
            at("2026-01-01T10:20:00")
        assert utc(Cron("*/20 * * * * *").newest(at("2026-01-01T10:00:00"),
                                                  at("2026-01-01T10:01:00"))) == [
            "2026-01-01T10:00:20", "2026-01-01T10:00:40", "2026-01-01T10:01:00"]

    def test_the_window_is_open_at_the_start_and_closed_at_the_end(self):
        cron = Cron("0 * * * *")
        assert utc(cron.newest(at("2026-01-01T10:00:00"), at("2026-01-01T12:00:00"))) == [
            "2026-01-01T11:00:00", "2026-01-01T12:00:00"]
        assert cron.next_after(at("2026-01-01T10:00:00")) == at("2026-01-01T11:00:00")
        # Fractions of a second: the instant at the whole second before is not after it.
        assert cron.next_after(at("2026-01-01T10:00:00.5")) == at("2026-01-01T11:00:00")
        assert cron.newest(at("2026-01-01T10:59:59.9"), at("2026-01-01T11:00:00.1")) == [
            at("2026-01-01T11:00:00")]

    def test_newest_walks_back_so_a_long_outage_costs_only_what_it_returns(self):
        cron = Cron("* * * * * *")  # every second, missed for ten years
        newest = cron.newest(at("2016-01-01T00:00:00"), at("2026-01-01T00:00:00"), 3)
        assert utc(newest) == ["2025-12-31T23:59:58", "2025-12-31T23:59:59",
                               "2026-01-01T00:00:00"]
        assert cron.newest(at("2016-01-01T00:00:00"), at("2026-01-01T00:00:00"), 0) == []

    def test_an_expression_is_read_on_the_wall_clock_of_its_zone(self):
        cron = Cron("0 9 * * 1-5", "Europe/Paris")
        # Friday 2026-01-02 09:00 CET is 08:00Z; the next is Monday's.
        assert cron.next_after(at("2026-01-01T12:00:00")) == at("2026-01-02T08:00:00")
        assert cron.next_after(at("2026-01-02T08:00:00")) == at("2026-01-05T08:00:00")
        # In summer, 09:00 CEST is 07:00Z.
        assert cron.next_after(at("2026-07-01T00:00:00")) == at("2026-07-01T07:00:00")


class TestDaylightSaving:
    """The issue's example, a 01:30 schedule in a zone that skips 01:30, does not fit New
    York (it skips 02:00-02:59): there 02:30 is the skipped time and 01:30 the repeated one."""

    @pytest.mark.parametrize("expression", ["30 2 * * *", "0 30 2 * * *"])
    def test_a_skipped_wall_time_runs_once_at_the_end_of_the_gap(self, expression):
        cron = Cron(expression, "America/New_York")
        runs = cron.newest(at("2026-03-06T12:00:00"), at("2026-03-10T12:00:00"))
        assert utc(runs) == ["2026-03-07T07:30:00",   # 02:30 EST
                             "2026-03-08T07:00:00",   # 03:00 EDT, the end of the gap
                             "2026-03-09T06:30:00",   # 02:30 EDT
                             "2026-03-10T06:30:00"]
        assert cron.next_after(at("2026-03-07T07:30:00")) == at("2026-03-08T07:00:00")
        assert cron.next_after(at("2026-03-08T07:00:00")) == at("2026-03-09T06:30:00")

    def test_every_wall_time_of_a_gap_runs_once_at_its_end(self):
        cron = Cron("0,20,40 2 * * *", "America/New_York")
        runs = cron.newest(at("2026-03-08T00:00:00"), at("2026-03-08T12:00:00"))
        assert utc(runs) == ["2026-03-08T07:00:00"]

    @pytest.mark.parametrize("expression", ["30 1 * * *", "0 30 1 * * *"])
    def test_a_repeated_wall_time_runs_once_the_first_time(self, expression):
        cron = Cron(expression, "America/New_York")
        runs = cron.newest(at("2026-10-30T12:00:00"), at("2026-11-03T12:00:00"))
        assert utc(runs) == ["2026-10-31T05:30:00",   # 01:30 EDT
                             "2026-11-01T05:30:00",   # 01:30 EDT, not again at 01:30 EST
                             "2026-11-02T06:30:00",   # 01:30 EST
                             "2026-11-03T06:30:00"]

    def test_inside_the_second_pass_of_a_repeated_hour_nothing_runs_again(self):
        cron = Cron("30 1 * * *", "America/New_York")
        second_pass = at("2026-11-01T06:15:00")  # 01:15 EST; 01:30 EDT ran 45 minutes ago
        assert cron.next_after(second_pass) == at("2026-11-02T06:30:00")
        assert cron.newest(at("2026-11-01T00:00:00"), second_pass) == [at("2026-11-01T05:30:00")]
        assert cron.newest(at("2026-11-01T05:30:00"), at("2026-11-01T06:59:59")) == []

    def test_a_rhythm_of_elapsed_time_follows_real_time(self):
        hourly = Cron("0 * * * *", "America/New_York")
        # Both 01:00 hours of the fall-back night, and no 02:00 on the spring-forward one.
        assert utc(hourly.newest(at("2026-11-01T04:30:00"), at("2026-11-01T07:30:00"))) == [
            "2026-11-01T05:00:00", "2026-11-01T06:00:00", "2026-11-01T07:00:00"]
        assert utc(hourly.newest(at("2026-03-08T05:30:00"), at("2026-03-08T08:30:00"))) == [
            "2026-03-08T06:00:00", "2026-03-08T07:00:00", "2026-03-08T08:00:00"]

    def test_a_half_hour_shift_and_a_missing_day(self):
        # Lord Howe: 02:00 -> 02:30 on 2026-10-04; 02:15 does not exist and runs at 02:30.
        lord_howe = Cron("15 2 * * *", "Australia/Lord_Howe")
        runs = lord_howe.newest(at("2026-10-02T12:00:00"), at("2026-10-05T12:00:00"))
        local = [r.astimezone(lord_howe.zone).strftime("%m-%d %H:%M") for r in runs]
        assert local == ["10-03 02:15", "10-04 02:30", "10-05 02:15"]
        # Samoa skipped Friday 2011-12-30 whole: its noon run happens at the end of the gap,
        # which is midnight starting the 31st.
        samoa = Cron("0 12 * * *", "Pacific/Apia")
        runs = samoa.newest(at("2011-12-29T00:00:00"), at("2011-12-31T12:00:00"))
        local = [r.astimezone(samoa.zone).strftime("%m-%d %H:%M") for r in runs]
        assert local == ["12-29 12:00", "12-31 00:00", "12-31 12:00"]



class TestBoundedSearches:
    """Every instant of these falls in New York's skipped hour (the second Sunday of March,
    02:00-03:00, since 2007): a search walked cronsim's wall times until the year 9999."""

    @pytest.mark.parametrize("expression", ["* 2 * 3 0#2", "*/10 * 2 * 3 0#2"])
    def test_a_cron_with_no_instant_ahead_gives_none_soon(self, expression):
        import time
        cron = Cron(expression, "America/New_York")
        started = time.monotonic()
        assert cron.next_after(at("2026-01-01T00:00:00")) is None
        assert cron.newest(at("2026-01-01T00:00:00"), at("2090-01-01T00:00:00")) == []
        # Far from either end, a walk back stops at ``after``, not 50 years back.
        assert cron.newest(at("2089-01-01T00:00:00"), at("2090-01-01T00:00:00")) == []
        assert time.monotonic() - started < 3.0
        # Before 2007 the clock changed in April: those instants are found.
        assert cron.next_after(at("2005-01-01T00:00:00")) == at("2005-03-13T07:00:00")

    def test_a_search_near_the_end_of_the_calendar_gives_none(self):
        assert Cron("0 0 1 1 *").next_after(datetime(9999, 6, 1, tzinfo=UTC)) is None
        assert Cron("0 0 1 1 *").newest(datetime(1, 1, 2, tzinfo=UTC),
                                        datetime(1, 6, 1, tzinfo=UTC)) == []

# A few expressions of each kind, and zones with every kind of transition.
EXPRESSIONS = ["30 2 * * *", "30 1 * * *", "0 30 2 * * *", "*/20 * * * *", "0 * * * *",
               "*/15 2 * * *", "*/20 * 2 * * *",
               "15,45 1-3 * * *", "0 0 * * *", "*/7 0 1 * * *", "*/20 * 1 * * *",
               "0 */2 * * *", "59 23 L * *"]
ZONES = ["UTC", "America/New_York", "Europe/London", "Australia/Lord_Howe", "America/Santiago",
         "Pacific/Apia"]
TRANSITIONS = [at("2026-03-08T07:00:00"), at("2026-11-01T06:00:00"), at("2026-03-29T01:00:00"),
               at("2026-10-25T01:00:00"), at("2026-10-03T15:30:00"), at("2026-09-06T04:00:00"),
               at("2011-12-30T10:00:00")]


@settings(max_examples=300, deadline=None)
@given(expression=st.sampled_from(EXPRESSIONS), zone=st.sampled_from(ZONES),
       near=st.sampled_from(TRANSITIONS),
       start=st.integers(min_value=-2 * 86400, max_value=86400),
       length=st.integers(min_value=0, max_value=2 * 86400))
def test_walking_back_finds_exactly_what_walking_forward_finds(expression, zone, near, start,
                                                               length):
    """Around real transitions: ascending, each instant once, the same set both ways, and
    the next instant after any one of them is the one that follows it."""
    cron = Cron(expression, zone)
    after = near + timedelta(seconds=start)
    until = after + timedelta(seconds=length)
    forward = []
    instant = cron.next_after(after)
    while instant is not None and instant <= until and len(forward) <= 1000:
        forward.append(instant)
        instant = cron.next_after(instant)
    backward = cron.newest(after, until, count=1001)
    assert backward == forward
    assert all(a < b for a, b in zip(forward, forward[1:]))
    assert all(after < i <= until and i.microsecond == 0 for i in forward)


def wall_matches(expression: str, wall: datetime) -> bool:
    """Whether cron names this wall time, asked of cronsim on a clock without a zone."""
    from cronsim import CronSim

    return next(CronSim(expression, wall - timedelta(seconds=1))) == wall


@settings(max_examples=150, deadline=None)
@given(expression=st.sampled_from(["*/20 * * * *", "0 * * * *", "*/15 1-2 * * *", "* 2 * * *",
                                   "10 */3 * * *", "* 1 * * *"]),
       zone=st.sampled_from(ZONES), near=st.sampled_from(TRANSITIONS),
       start=st.integers(min_value=-3 * 3600, max_value=3600))
def test_a_rhythm_runs_at_each_minute_whose_wall_time_matches(expression, zone, near, start):
    """Checked minute by minute against the definition: every real instant whose local wall
    time the expression names runs, and nothing else (every zone here is whole minutes off
    UTC, so wall minutes are real minutes)."""
    cron = Cron(expression, zone)
    assert not cron.on_wall_clock
    after = near + timedelta(seconds=start - start % 60)
    minutes = [after + timedelta(minutes=m) for m in range(1, 4 * 60 + 1)]
    expected = [t for t in minutes
                if wall_matches(expression, t.astimezone(cron.zone).replace(tzinfo=None))]
    assert cron.newest(after, minutes[-1]) == expected
