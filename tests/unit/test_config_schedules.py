"""Config validation of schedules and global limits: every problem reported at once, each
naming its key path."""

from __future__ import annotations


import pytest


from test_config import HANDLERS, parse, problem_for, problems_of

# --- schedules ---------------------------------------------------------------------------------


def with_schedules(schedules, **tree):
    return {"handlers": HANDLERS, "schedules": schedules, **tree}


def test_a_schedule_is_read_with_its_defaults():
    config = parse(with_schedules({
        "nightly": {"cron": "30 2 * * *", "task_type": "echo"},
        "ticks": {"cron": "*/10 * * * * *", "task_type": "record", "timezone": "Europe/Paris",
                  "payload": {"report": "sales", "days": [1, 2]}, "priority": -5,
                  "max_retries": 0, "catch_up": "all", "max_catch_up": 7}}))
    nightly, ticks = config.schedules
    assert (nightly.name, nightly.cron.expression, nightly.cron.timezone, nightly.task_type,
            nightly.payload, nightly.priority, nightly.max_retries, nightly.catch_up,
            nightly.max_catch_up) == ("nightly", "30 2 * * *", "UTC", "echo", {}, 0, 3,
                                      "latest", 100)
    assert (ticks.cron.timezone, ticks.payload, ticks.priority, ticks.max_retries,
            ticks.catch_up, ticks.max_catch_up) == ("Europe/Paris",
                                                    {"report": "sales", "days": [1, 2]}, -5, 0,
                                                    "all", 7)
    assert parse({}).schedules == () and parse({"schedules": None}).schedules == ()


def test_a_schedules_task_id_names_the_instant_in_utc_to_the_second():
    from datetime import datetime, timedelta, timezone

    schedule = parse(with_schedules({"nightly": {"cron": "@daily", "task_type": "echo"}})
                     ).schedules[0]
    paris = timezone(timedelta(hours=2))
    assert schedule.task_id(datetime(2026, 7, 1, 2, 30, tzinfo=paris)) == \
        "schedule:nightly:2026-07-01T00:30:00Z"


@pytest.mark.parametrize("schedule, key_path, fragment", [
    ({"cron": "61 * * * *", "task_type": "echo"}, "schedules.s.cron", "bad minute field"),
    ({"cron": "* * * *", "task_type": "echo"}, "schedules.s.cron", "has 4 fields"),
    ({"cron": 5, "task_type": "echo"}, "schedules.s.cron", "must be a string"),
    ({"task_type": "echo"}, "schedules.s.cron", "is required"),
    ({"cron": "@daily"}, "schedules.s.task_type", "is required"),
    ({"cron": "@daily", "task_type": ""}, "schedules.s.task_type", "must not be empty"),
    ({"cron": "@daily", "task_type": 7}, "schedules.s.task_type", "must be a string"),
    ({"cron": "@daily", "task_type": "echo", "timezone": "Mars/Olympus"},
     "schedules.s.timezone", "unknown time zone 'Mars/Olympus'"),
    ({"cron": "@daily", "task_type": "echo", "timezone": 1}, "schedules.s.timezone",
     "IANA time zone"),
    ({"cron": "@daily", "task_type": "echo", "catch_up": "some"}, "schedules.s.catch_up",
     "one of all, latest, skip"),
    ({"cron": "@daily", "task_type": "echo", "catch_up": False}, "schedules.s.catch_up",
     "got False"),
    ({"cron": "@daily", "task_type": "echo", "max_catch_up": 0}, "schedules.s.max_catch_up",
     "from 1 to 10000"),
    ({"cron": "@daily", "task_type": "echo", "max_catch_up": 1.5}, "schedules.s.max_catch_up",
     "whole number"),
    ({"cron": "@daily", "task_type": "echo", "priority": 2**31}, "schedules.s.priority",
     "2147483647"),
    ({"cron": "@daily", "task_type": "echo", "payload": [1]}, "schedules.s.payload",
     "must be a mapping"),
    ({"cron": "@daily", "task_type": "echo", "payload": {"n": float("nan")}},
     "schedules.s.payload", "cannot be stored as JSON"),
    ({"cron": "@daily", "task_type": "echo", "payload": {1: "x"}}, "schedules.s.payload",
     "keys must be strings"),
    ({"cron": "@daily", "task_type": "echo", "payload": {"big": "x" * 3000}},
     "schedules.s.payload", "max_payload_bytes"),
    ({"cron": "@daily", "task_type": "echo", "every": "day"}, "schedules.s.every",
     "unknown key"),
    # Every instant in New York's skipped hour: the scheduler would find no next run, ever.
    ({"cron": "* 2 * 3 0#2", "task_type": "echo", "timezone": "America/New_York"},
     "schedules.s.cron", "no instant in the next 50 years in America/New_York"),
])
def test_a_bad_schedule_is_one_problem_naming_its_key_path(schedule, key_path, fragment):
    problem = problem_for(problems_of(with_schedules({"s": schedule}, max_payload_bytes=2048)),
                          key_path)
    assert fragment in problem, problem


@pytest.mark.parametrize("schedules, key_path", [
    ({"has:colon": {"cron": "@daily", "task_type": "echo"}}, "schedules.has:colon"),
    ({"x" * 101: {"cron": "@daily", "task_type": "echo"}}, "schedules.'" + "x" * 27),
    ({"s": None}, "schedules.s"),
    ({"s": "@daily"}, "schedules.s"),
    ([{"cron": "@daily"}], "schedules"),
])
def test_a_bad_schedule_name_or_shape_is_named(schedules, key_path):
    problems = problems_of(with_schedules(schedules))
    assert len(problems) == 1 and problems[0].startswith(key_path), problems


def test_every_problem_of_every_schedule_is_reported_at_once():
    problems = problems_of(with_schedules({
        "a": {"cron": "61 * * * *", "task_type": "", "timezone": "Nowhere"},
        "b": {"cron": "@daily", "task_type": "echo", "catch_up": "never"}}))
    for key_path in ("schedules.a.cron", "schedules.a.timezone", "schedules.b.catch_up"):
        problem_for(problems, key_path)


def test_a_type_without_a_handler_is_a_warning_not_a_problem():
    config = parse(with_schedules({"resize": {"cron": "@hourly", "task_type": "resize"},
                                   "echo": {"cron": "@hourly", "task_type": "echo"}}))
    assert config.warnings() == [
        "schedules.resize.task_type: no handler for 'resize' under handlers.types; its tasks "
        "wait for a daemon whose config handles it"]
    # A config that names no handler only enqueues: it cannot tell.
    assert parse({"schedules": {"resize": {"cron": "@hourly", "task_type": "resize"}}}
                 ).warnings() == []


def test_limits_are_read_as_task_type_to_a_number():
    assert parse({"limits": {"charge": 2, "report": 10_000}}).limits == \
        {"charge": 2, "report": 10_000}
    assert parse({}).limits == {}


@pytest.mark.parametrize("limits, key_path", [
    ({"charge": 0}, "limits.charge"),
    ({"charge": -1}, "limits.charge"),
    ({"charge": 10_001}, "limits.charge"),
    ({"charge": 1.5}, "limits.charge"),
    ({"charge": True}, "limits.charge"),
    ({"charge": "2"}, "limits.charge"),
    ({"charge": None}, "limits.charge"),
    ({"": 2}, "limits.''"),
    ({"t" * 201: 2}, "limits.'" + "t" * 27),
    (["charge"], "limits"),
])
def test_a_bad_limit_is_named_by_its_path(limits, key_path):
    problems = problems_of({"limits": limits})
    assert len(problems) == 1 and problems[0].startswith(key_path), problems
    assert "\n" not in problems[0]


# --- task type names: the client's rule everywhere the config names one ---------------------

BAD_TYPE_NAMES = ["nul\x00inside", "\ud800", "t" * 10_000, " padded "]


def client_refusal(name) -> str:
    """What a client's submit says of this task type, less the field's name."""
    from supervisor.errors import UsageError
    from supervisor.task_fields import prepare_task
    with pytest.raises(UsageError) as raised:
        prepare_task(name)
    return str(raised.value).partition("task_type: ")[2]


@pytest.mark.parametrize("place", ["handlers.types", "pools.p.task_types", "limits",
                                   "schedules"])
def test_a_task_type_no_client_could_submit_is_one_problem_per_name(place):
    good = {"echo": "basic:echo"}
    trees = {
        "handlers.types": {"handlers": {"types": {**good, **{n: "basic:echo"
                                                           for n in BAD_TYPE_NAMES}}}},
        "pools.p.task_types": {"handlers": {"types": good},
                               "pools": {"p": {"task_types": ["echo", *BAD_TYPE_NAMES]}}},
        "limits": {"limits": {"echo": 1, **{n: 1 for n in BAD_TYPE_NAMES}}},
        "schedules": {"handlers": {"types": good},
                      "schedules": {f"s{i}": {"cron": "@daily", "task_type": n}
                                    for i, n in enumerate(BAD_TYPE_NAMES)}},
    }
    problems = problems_of(trees[place])
    assert len(problems) == len(BAD_TYPE_NAMES), problems
    for problem, name in zip(problems, BAD_TYPE_NAMES):
        assert problem.startswith(place), problem
        assert problem.endswith(client_refusal(name)), (problem, client_refusal(name))
        assert len(problem) < 300 and problem.isprintable(), problem
