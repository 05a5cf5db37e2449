"""The registry's snapshot of a child: its claims, as it reported them, with the state its claim
board holds for each (a real memfd board, written as the child writes it)."""

from __future__ import annotations

import types

import pytest

from supervisor.claim_board import FINISHED, STARTED, ClaimBoard
from supervisor.daemon.children import ClaimedTask, Child
from supervisor.daemon.snapshot import MAX_TASKS_SHOWN, child_snapshot, daemon_state


@pytest.fixture
def child():
    board = ClaimBoard.create(20)
    made = Child(types.SimpleNamespace(pid=4242), "default", 3, 2, link=None, board=board)
    yield made
    board.close()


def claim(child: Child, count: int) -> list[int]:
    """The child claims a batch: told to the supervisor, written on its board."""
    tokens = list(range(10, 10 + count))
    for token in tokens:
        child.claims[token] = ClaimedTask(f"t{token}", "echo")
    child.board.claimed(tokens)
    return tokens


def test_a_batch_shows_the_running_task_first_then_the_rest_in_order(child):
    child.booted = True
    tokens = claim(child, 4)
    child.board.mark(0, tokens[0], FINISHED)
    child.board.mark(1, tokens[1], STARTED)
    shot = child_snapshot(child)
    assert (shot.pool, shot.slot, shot.pid, shot.generation) == ("default", 3, 4242, 2)
    assert (shot.state, shot.held) == ("working", 4)
    assert [(t.task_id, t.state) for t in shot.tasks] == [
        ("t11", "running"), ("t10", "finished"), ("t12", "claimed"), ("t13", "claimed")]


def test_a_child_holding_many_claims_lists_only_a_few(child):
    child.booted = True
    tokens = claim(child, 15)
    child.board.mark(14, tokens[14], STARTED)
    shot = child_snapshot(child)
    assert shot.held == 15 and len(shot.tasks) == MAX_TASKS_SHOWN
    assert shot.tasks[0].task_id == "t24" and shot.tasks[0].state == "running"


def test_a_child_state_says_booting_idle_or_stopping(child):
    assert child_snapshot(child).state == "booting"
    child.booted = True
    assert child_snapshot(child).state == "idle"
    claim(child, 1)
    child.stopping = "reload"
    shot = child_snapshot(child)
    assert (shot.state, shot.stopping, shot.held) == ("stopping", "reload", 1)
    child.board.close()
    child.board = None  # a dead child's board is closed before it is dropped
    assert child_snapshot(child).tasks[0].state == "claimed"


@pytest.mark.parametrize("ready, reloading, stopping, state", [
    (False, False, False, "starting"), (True, False, False, "running"),
    (True, True, False, "reloading"), (True, True, True, "stopping"),
    (False, False, True, "stopping")])
def test_the_daemon_state(ready, reloading, stopping, state):
    assert daemon_state(ready=ready, reloading=reloading, stopping=stopping) == state
