"""Reading the executions that tests/handlers/timed_handlers.py records outside the database:
which task ran in which process, from when to when, and which runs of a task overlapped."""

from __future__ import annotations


def read_runs(path) -> list[dict]:
    """The executions logged in ``path``: [{task_id, pid, start, end (None if unfinished)}]."""
    runs: list[dict] = []
    open_runs: dict[tuple[str, int], dict] = {}
    try:
        text = open(path).read()
    except FileNotFoundError:
        return runs
    for line in text.splitlines():
        what, task_id, pid, at = line.split()
        key = (task_id, int(pid))
        if what == "start":
            run = {"task_id": task_id, "pid": int(pid), "start": float(at), "end": None}
            runs.append(run)
            open_runs[key] = run
        elif key in open_runs:
            open_runs.pop(key)["end"] = float(at)
    return runs


def overlaps(runs: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of runs of the same task whose time spans overlap (an unfinished run never
    ends)."""
    found = []
    by_task: dict[str, list[dict]] = {}
    for run in runs:
        by_task.setdefault(run["task_id"], []).append(run)
    for task_runs in by_task.values():
        task_runs.sort(key=lambda r: r["start"])
        for first, second in zip(task_runs, task_runs[1:]):
            if first["end"] is None or second["start"] < first["end"]:
                found.append((first, second))
    return found
