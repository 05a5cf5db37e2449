"""Config loading and validation: every problem reported at once, each naming its key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import (DEFAULT_LEASE_SECONDS, DEFAULT_RENEW_INTERVAL,
                               MAX_RETENTION_SECONDS, load_config, parse_config)
from supervisor.errors import ConfigError

HANDLERS = {"path": "handlers", "types": {"echo": "basic:echo", "record": "basic:record"}}


def parse(tree, base_dir: Path = Path("/srv/pgtaskd"), env=None):
    return parse_config(tree, base_dir=base_dir, env=env or {})


def problems_of(tree, **kwargs) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        parse(tree, **kwargs)
    return raised.value.problems


def problem_for(problems: list[str], key_path: str) -> str:
    found = [p for p in problems if p.startswith(f"{key_path}:")]
    assert len(found) == 1, f"expected one problem for {key_path}, got {problems}"
    return found[0]


def test_an_empty_config_gives_the_defaults():
    config = parse({})
    assert config.lease.seconds == DEFAULT_LEASE_SECONDS
    assert config.lease.renew_interval == DEFAULT_RENEW_INTERVAL
    assert config.database.dsn is None
    assert config.handlers.types == {}
    assert [(p.name, p.processes) for p in config.pools] == [("default", 1)]


def test_a_full_config_is_read_as_written():
    config = parse({
        "database": {"dsn": "postgresql://db/tasks", "connect_timeout": 2},
        "lease": {"seconds": 12, "renew_interval": 4},
        "poll_interval": 0.25,
        "retry": {"base_delay": 1, "max_delay": 60, "jitter": 0.2},
        "handlers": HANDLERS,
        "pools": {"fast": {"processes": 4, "task_types": ["echo"]}, "slow": {"processes": 0}},
        "reaper": {"interval": 3, "batch_size": 50},
        "metrics": {"listen": ""},
    })
    assert config.database.dsn == "postgresql://db/tasks"
    assert (config.lease.seconds, config.lease.renew_interval) == (12.0, 4.0)
    assert (config.retry.base_delay, config.retry.max_delay, config.retry.jitter) == (1, 60, 0.2)
    assert [(p.name, p.processes, p.task_types) for p in config.pools] == [
        ("fast", 4, ("echo",)), ("slow", 0, ("echo", "record"))]
    assert config.reaper.batch_size == 50
    assert config.metrics.address is None


def test_the_metrics_server_limits_have_defaults_and_can_be_set():
    assert (parse({}).metrics.max_connections, parse({}).metrics.request_timeout) == (64, 5.0)
    config = parse({"metrics": {"max_connections": 8, "request_timeout": 2.5}})
    assert (config.metrics.max_connections, config.metrics.request_timeout) == (8, 2.5)


@pytest.mark.parametrize("tree, key_path", [
    ({"bogus": 1}, "bogus"),
    ({"lease": {"seconds": 30, "renew_interval": 10, "extra": 1}}, "lease.extra"),
    ({"database": {"host": "x"}}, "database.host"),
    ({"pools": {"default": {"processes": 1, "threads": 4}}}, "pools.default.threads"),
])
def test_an_unknown_key_is_named_by_its_path(tree, key_path):
    assert "unknown key" in problem_for(problems_of(tree), key_path)


@pytest.mark.parametrize("tree, key_path", [
    ({"lease": {"seconds": "thirty"}}, "lease.seconds"),
    ({"lease": {"seconds": True}}, "lease.seconds"),
    ({"lease": "long"}, "lease"),
    ({"poll_interval": [1]}, "poll_interval"),
    ({"retry": {"jitter": "lots"}}, "retry.jitter"),
    ({"pools": {"default": {"processes": "two"}}}, "pools.default.processes"),
    ({"pools": {"default": {"processes": 1.5}}}, "pools.default.processes"),
    ({"pools": {"default": {"processes": -1}}}, "pools.default.processes"),
    ({"pools": {"default": {"task_types": "echo"}}}, "pools.default.task_types"),
    ({"pools": {"default": {"task_types": ["nope"]}}, "handlers": HANDLERS},
     "pools.default.task_types"),
    ({"handlers": {"types": {"x": 42}}}, "handlers.types.x"),
    ({"handlers": {"types": {"x": "no-colon"}}}, "handlers.types.x"),
    ({"handlers": {"path": 7}}, "handlers.path"),
    ({"reaper": {"batch_size": 0}}, "reaper.batch_size"),
    ({"metrics": {"listen": "nowhere"}}, "metrics.listen"),
    ({"metrics": {"max_connections": 0}}, "metrics.max_connections"),
    ({"metrics": {"max_connections": 100_000}}, "metrics.max_connections"),
    ({"metrics": {"max_connections": 8.5}}, "metrics.max_connections"),
    ({"metrics": {"request_timeout": 0}}, "metrics.request_timeout"),
    ({"metrics": {"request_timeout": float("inf")}}, "metrics.request_timeout"),
    ({"metrics": {"request_timeout": float("nan")}}, "metrics.request_timeout"),
    ({"metrics": {"request_timeout": 3600}}, "metrics.request_timeout"),
    ({"database": {"dsn": 5}}, "database.dsn"),
])
def test_a_wrong_value_is_named_by_its_path(tree, key_path):
    problem_for(problems_of(tree), key_path)


def test_every_problem_is_reported_at_once():
    problems = problems_of({"lease": {"seconds": "x"}, "bogus": 1,
                            "pools": {"default": {"processes": "two"}}})
    for key_path in ("lease.seconds", "bogus", "pools.default.processes"):
        problem_for(problems, key_path)


@pytest.mark.parametrize("seconds, renew_interval", [(4, 3.9), (4, 3.1), (30, 28.5), (1, 0.8),
                                                     (30, 30), (30, 45)])
def test_a_renewal_that_cannot_land_before_the_workers_margin_is_refused(seconds,
                                                                        renew_interval):
    """Lease 4 / renew 3.9: the worker stops trusting its lease at 3.8 s, before the first
    renewal is even sent, so every task longer than that failed with no fault anywhere."""
    problems = problems_of({"lease": {"seconds": seconds, "renew_interval": renew_interval}})
    assert len(problems) == 1, problems
    problem = problem_for(problems, "lease.renew_interval")
    assert "lease.seconds" in problem and "one retry" in problem, problem


@pytest.mark.parametrize("seconds, renew_interval", [(4, 2.9), (30, 10), (1.5, 0.3), (2, 1.4),
                                                     (1, 0.1), (1, 0.7)])
def test_a_renewal_with_time_for_one_retry_is_accepted(seconds, renew_interval):
    parse({"lease": {"seconds": seconds, "renew_interval": renew_interval}})


@pytest.mark.parametrize("seconds", [0, -5])
def test_a_lease_must_last_some_time(seconds):
    problem_for(problems_of({"lease": {"seconds": seconds, "renew_interval": 0.1}}),
                "lease.seconds")


def test_retry_bounds_are_checked():
    problems = problems_of({"retry": {"base_delay": 10, "max_delay": 5, "jitter": 2}})
    problem_for(problems, "retry.max_delay")
    problem_for(problems, "retry.jitter")


# -- concurrency ----------------------------------------------------------------------------


def test_a_pool_runs_one_task_at_a_time_unless_told_otherwise():
    tree = {"handlers": HANDLERS, "pools": {"io": {"concurrency": 64}, "cpu": {}}}
    assert {p.name: p.concurrency for p in parse(tree).pools} == {"io": 64, "cpu": 1}


def test_what_a_concurrent_child_cannot_honour_is_refused_naming_both_keys():
    handlers = {"path": "handlers",
                "types": {"mail": "m:send", "card": {"handler": "c:charge", "timeout": 30},
                          "file": {"handler": "f:write", "cancel": "kill"}}}
    problems = problems_of({"handlers": handlers,
                            "pools": {"io": {"concurrency": 8, "batch_size": 5}}})
    assert len(problems) == 3, problems
    assert "pools.io.concurrency" in problem_for(problems, "pools.io.batch_size")
    assert "pools.io" in problem_for(problems, "handlers.types.card.timeout")
    assert "pools.io" in problem_for(problems, "handlers.types.file.cancel")


# -- retention ------------------------------------------------------------------------------

DAY = 86400.0


def test_retention_defaults_keep_completed_a_week_and_failures_a_month():
    retention = parse({}).retention
    assert (retention.completed, retention.failed, retention.cancelled) == (
        7 * DAY, 30 * DAY, 30 * DAY)
    assert (retention.interval, retention.batch_size) == (60.0, 1000)
    assert retention.periods() == {"COMPLETED": 7 * DAY, "FAILED": 30 * DAY,
                                   "CANCELLED": 30 * DAY}


def test_a_null_retention_means_the_default_not_forever():
    retention = parse({"retention": {"completed": None, "failed": None, "interval": None,
                                     "batch_size": None}}).retention
    assert retention == parse({}).retention
    assert parse({"retention": None}).retention == parse({}).retention


def test_retention_false_keeps_that_status_forever(tmp_path):
    config_file = tmp_path / "pgtaskd.yaml"
    config_file.write_text("retention:\n  completed: 3600\n  failed: false\n"
                           "  interval: 5\n  batch_size: 50\n")
    retention = load_config(config_file, env={}).retention
    assert retention.failed is None
    assert retention.periods() == {"COMPLETED": 3600.0, "CANCELLED": 30 * DAY}
    assert (retention.interval, retention.batch_size) == (5.0, 50)


def test_retention_false_for_every_status_deletes_nothing():
    retention = parse({"retention": {"completed": False, "failed": False,
                                     "cancelled": False}}).retention
    assert retention.periods() == {}


@pytest.mark.parametrize("tree, key_path", [
    ({"retention": "weekly"}, "retention"),
    ({"retention": {"keep": 5}}, "retention.keep"),
    ({"retention": {"completed": "7d"}}, "retention.completed"),
    ({"retention": {"completed": True}}, "retention.completed"),
    ({"retention": {"completed": -1}}, "retention.completed"),
    ({"retention": {"failed": float("inf")}}, "retention.failed"),
    ({"retention": {"cancelled": float("nan")}}, "retention.cancelled"),
    ({"retention": {"cancelled": MAX_RETENTION_SECONDS + 1}}, "retention.cancelled"),
    ({"retention": {"interval": 0}}, "retention.interval"),
    ({"retention": {"interval": float("inf")}}, "retention.interval"),
    ({"retention": {"interval": False}}, "retention.interval"),
    ({"retention": {"batch_size": 0}}, "retention.batch_size"),
    ({"retention": {"batch_size": 2.5}}, "retention.batch_size"),
    ({"retention": {"batch_size": 1_000_000}}, "retention.batch_size"),
])
def test_a_wrong_retention_value_is_named_by_its_path(tree, key_path):
    problem_for(problems_of(tree), key_path)


def test_a_retention_of_zero_is_refused_and_points_at_false():
    """0 reads as "off" to some and as "delete at once" to others: neither guess is made."""
    problem = problem_for(problems_of({"retention": {"failed": 0}}), "retention.failed")
    assert "greater than 0" in problem and "false to keep these tasks forever" in problem


def test_non_finite_retentions_from_yaml_are_refused(tmp_path):
    config_file = tmp_path / "pgtaskd.yaml"
    config_file.write_text("retention:\n  completed: .inf\n  failed: .nan\n")
    with pytest.raises(ConfigError) as raised:
        load_config(config_file, env={})
    assert raised.value.problems == [
        f"{config_file}: retention.completed: must be a finite number "
        f"(or false to keep these tasks forever), got inf",
        f"{config_file}: retention.failed: must be a finite number "
        f"(or false to keep these tasks forever), got nan"]
# -- floors on durations --------------------------------------------------------------------

@pytest.mark.parametrize("key_path, floor", [
    ("lease.seconds", 1), ("lease.renew_interval", 0.1), ("poll_interval", 0.01),
    ("reaper.interval", 0.1), ("health.interval", 0.1), ("health.max_pending_age", 1),
    ("retention.interval", 0.1), ("database.connect_timeout", 0.1),
    ("metrics.request_timeout", 0.1), ("reload_timeout", 0.1),
    ("handlers.types.echo.timeout", 0.1),
])
def test_a_duration_below_its_floor_is_one_problem_naming_the_floor(key_path, floor):
    """1e-9 s between polls or reaper passes burns a core on an idle daemon; a lease of a
    millisecond fails a task before it runs."""
    def tree_with(value):
        *sections, key = key_path.split(".")
        tree = {"handlers": {"types": {"echo": {"handler": "basic:echo"}}}}
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = value
        if key_path == "lease.seconds":
            tree["lease"]["renew_interval"] = 0.1
        return tree

    problem = problem_for(problems_of(tree_with(floor * 0.999)), key_path)
    assert f"at least {floor:g}" in problem, problem
    assert problem_for(problems_of(tree_with(1e-9)), key_path)
    parse(tree_with(floor))


# -- metrics.listen -------------------------------------------------------------------------

@pytest.fixture
def no_dns(monkeypatch):
    """Reading metrics.listen must not resolve a name: a lookup here fails the test."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError(f"a name was resolved: {args}")
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        monkeypatch.setattr(socket, name, refuse)


@pytest.mark.parametrize("listen, warned", [
    ("127.0.0.1:9464", False), ("127.0.0.2:9464", False), ("[::1]:9464", False),
    ("0.0.0.0:9464", True), ("[::]:9464", True), ("192.168.1.5:9464", True),
])
def test_a_bind_address_off_loopback_is_allowed_with_a_warning(no_dns, listen, warned):
    """The endpoint has no authentication: whoever can reach it reads the queue's state."""
    config = parse({"metrics": {"listen": listen}})
    warnings = [w for w in config.warnings() if w.startswith("metrics.listen:")]
    assert len(warnings) == warned, config.warnings()
    if warned:
        assert "not a loopback address" in warnings[0] and "authentication" in warnings[0]


@pytest.mark.parametrize("listen, fragment", [
    ("127.0.0.1:0", "port must be from 1 to 65535"),
    ("127.0.0.1:65536", "port must be from 1 to 65535"),
    ("localhost:9464", "an IP address"),
    ("metrics.example.com:9464", "an IP address"),
    ("300.1.1.1:9464", "an IP address"),
    ("[::g]:9464", "an IP address"),
])
def test_a_listen_address_without_a_port_or_an_ip_literal_is_refused(no_dns, listen, fragment):
    problem = problem_for(problems_of({"metrics": {"listen": listen}}), "metrics.listen")
    assert fragment in problem and "\n" not in problem, problem


HASH = ("scrypt$16384$8$1$cfKoMazCuzK1ku/q4PBBqQ==$"
        "z8toESv0o2xIy8w4cUDCH4zYhCnHGq8ZVnZ1q1bTbtE=")


def test_the_web_section_has_defaults_and_can_be_set():
    default = parse({}).web
    assert (default.listen, default.actions, default.auth.enabled) == ("127.0.0.1:8464", False,
                                                                       False)
    web = parse({"web": {"listen": "[::1]:9000", "actions": True, "max_connections": 8,
                         "request_timeout": 2, "refresh_interval": 0.5, "db_connections": 2,
                         "auth": {"users": {"ops": HASH}, "proxy_header": "X-Forwarded-User",
                                  "trusted_proxies": ["10.0.0.5"]}}}).web
    assert web.address == ("::1", 9000) and not web.exposed and web.actions
    assert web.auth.users == {"ops": HASH} and web.auth.proxy_header == "x-forwarded-user"
    assert web.auth.trusted_proxies == ("10.0.0.5",)
    assert (web.max_connections, web.request_timeout, web.db_connections) == (8, 2.0, 2)


@pytest.mark.parametrize("web, key_path, fragment", [
    ({"listen": "localhost:80"}, "web.listen", "must be an IP address"),
    ({"actions": "yes"}, "web.actions", "must be true or false"),
    ({"actions": True}, "web.actions", "needs web.auth"),
    ({"auth": {"users": {"ops": "hunter2"}}}, "web.auth.users.ops", "not a password hash"),
    ({"auth": {"users": {"ops": HASH.replace("16384", "16385")}}}, "web.auth.users.ops",
     "out of bounds"),
    ({"auth": {"users": ["ops"]}}, "web.auth.users", "must be a mapping"),
    ({"auth": {"proxy_header": "X User"}}, "web.auth.proxy_header", "header name"),
    ({"auth": {"trusted_proxies": ["proxy.local"]}}, "web.auth.trusted_proxies",
     "IP addresses"),
    ({"max_connections": 0}, "web.max_connections", "from 1 to"),
    ({"refresh_interval": 0.01}, "web.refresh_interval", "at least 0.5"),
    ({"login": True}, "web.login", "unknown key"),
])
def test_a_bad_web_key_is_named_by_its_path(web, key_path, fragment):
    assert fragment in problem_for(problems_of({"web": web}), key_path)


def test_a_web_console_beyond_loopback_without_auth_is_warned_of():
    assert any(w.startswith("web.listen: 0.0.0.0:8464 is not a loopback address")
               for w in parse({"web": {"listen": "0.0.0.0:8464"}}).warnings())
    assert not parse({"web": {"listen": "0.0.0.0:8464",
                              "auth": {"users": {"ops": HASH}}}}).warnings()
