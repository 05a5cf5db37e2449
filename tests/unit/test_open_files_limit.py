"""The supervisor's open-files limit: raised to the hard limit, within MAX_OPEN_FILES."""

from __future__ import annotations

import resource

import pytest

from supervisor.daemon import open_files as limits_module
from supervisor.daemon.open_files import MAX_OPEN_FILES, raise_open_files_limit

INF = resource.RLIM_INFINITY


@pytest.fixture
def limits(monkeypatch):
    """A fake RLIMIT_NOFILE: set ``limits.now``; ``limits.set`` records setrlimit calls."""
    class Fake:
        now = (1024, 4096)
        set: list = []

    def setrlimit(which, value):
        Fake.set.append(value)
        Fake.now = value

    Fake.set = []
    monkeypatch.setattr(limits_module.resource, "getrlimit", lambda which: Fake.now)
    monkeypatch.setattr(limits_module.resource, "setrlimit", setrlimit)
    return Fake


@pytest.mark.parametrize("start, raised", [
    ((1024, 4096), (4096, 4096)),
    ((1024, INF), (MAX_OPEN_FILES, INF)),
    ((1024, 1 << 30), (MAX_OPEN_FILES, 1 << 30)),
])
def test_the_soft_limit_goes_up_to_the_hard_limit_within_the_cap(limits, start, raised):
    limits.now = start
    assert raise_open_files_limit() == start
    assert limits.set == [raised]


@pytest.mark.parametrize("start", [(4096, 4096), (INF, INF), (MAX_OPEN_FILES, INF),
                                   (100_000, 200_000)])
def test_a_limit_already_high_enough_is_never_lowered(limits, start):
    limits.now = start
    assert raise_open_files_limit() is None
    assert limits.set == []
