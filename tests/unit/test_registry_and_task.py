"""Handler lookup by task type, and the Task handle a handler receives."""

from __future__ import annotations

import uuid

import pytest

from conftest import TEST_HANDLERS
from supervisor.errors import ConfigError, TaskCancelled
from supervisor.worker.registry import load_handlers
from supervisor.worker.task import Task


def unique_module(folder, body: str) -> str:
    """Write a handler module under a fresh name: imported modules stay cached per name."""
    name = f"handlers_{uuid.uuid4().hex[:10]}"
    (folder / f"{name}.py").write_text(body)
    return name


def test_handlers_load_by_module_and_function():
    handlers = load_handlers(TEST_HANDLERS, {"echo": "basic:echo", "sleep": "basic:sleep"})
    assert sorted(handlers) == ["echo", "sleep"]
    assert handlers["echo"].__name__ == "echo"


def test_only_the_requested_types_are_loaded(tmp_path):
    broken = unique_module(tmp_path, "raise ImportError('never imported')\n")
    ok = unique_module(tmp_path, "def run(task):\n    return 1\n")
    handlers = load_handlers(tmp_path, {"wanted": f"{ok}:run", "other": f"{broken}:run"},
                             only=("wanted",))
    assert list(handlers) == ["wanted"]


def test_an_import_error_names_the_task_type(tmp_path):
    broken = unique_module(tmp_path, "import module_that_does_not_exist_anywhere\n")
    with pytest.raises(ConfigError) as raised:
        load_handlers(tmp_path, {"mailer": f"{broken}:send"})
    [problem] = raised.value.problems
    assert problem.startswith("handlers.types.mailer: cannot import")
    assert "ModuleNotFoundError" in problem and "module_that_does_not_exist_anywhere" in problem


def test_an_exception_raised_at_import_is_reported_not_raised(tmp_path):
    broken = unique_module(tmp_path, "raise RuntimeError('bad settings')\n")
    with pytest.raises(ConfigError, match=r"handlers\.types\.x: .*RuntimeError: bad settings"):
        load_handlers(tmp_path, {"x": f"{broken}:run"})


def test_a_missing_function_and_a_missing_module_are_both_reported(tmp_path):
    ok = unique_module(tmp_path, "def run(task):\n    pass\nnot_callable = 3\n")
    with pytest.raises(ConfigError) as raised:
        load_handlers(tmp_path, {"a": f"{ok}:absent", "b": f"{ok}:not_callable",
                                 "c": "no_such_module_here:run", "d": f"{ok}:run"})
    problems = raised.value.problems
    assert [p.split(":")[0] for p in problems] == ["handlers.types.a", "handlers.types.b",
                                                     "handlers.types.c"]
    assert "has no function 'absent'" in problems[0]


# -- the Task handle --------------------------------------------------------------------------

def make_task(**row) -> Task:
    base = {"id": "t1", "name": "n", "task_type": "echo", "payload": {"a": 1}, "priority": 0,
            "retry_count": 2, "max_retries": 3, "attempts": 3}
    return Task.from_row({**base, **row}, worker_id="w1")


def test_a_task_carries_its_row_and_a_stable_idempotency_key():
    task = make_task()
    assert (task.id, task.payload, task.retry_count, task.attempts) == ("t1", {"a": 1}, 2, 3)
    assert task.idempotency_key == "t1"
    assert make_task(payload=[1, 2]).payload == {"value": [1, 2]}


def test_a_task_turns_cancelled_once_and_keeps_the_first_reason():
    task = make_task()
    assert not task.is_cancelled()
    task.raise_if_cancelled()
    task.mark_lost("cancelled")
    task.mark_lost("lease lost")
    assert task.is_cancelled()
    assert task.cancel_reason == "cancelled"
    with pytest.raises(TaskCancelled, match="cancelled"):
        task.raise_if_cancelled()


def test_a_task_without_a_pool_has_no_connection():
    with pytest.raises(RuntimeError, match="no database connection"):
        make_task().connection()
