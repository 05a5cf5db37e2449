"""Reading the executions that tests/handlers/timed_handlers.py records outside the database:
which task ran in which process, from when to when, and which runs of a task overlapped."""

from __future__ import annotations

from typing import Callable


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


def most_at_once(runs: list[dict]) -> int:
    """The largest number of runs open at one instant (an end before a start at a tie; an
    unfinished run never ends)."""
    edges = sorted([(run["start"], 1) for run in runs]
                   + [(run["end"] if run["end"] is not None else float("inf"), -1)
                      for run in runs], key=lambda edge: (edge[0], edge[1]))
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


def audit(runs: list[dict], task_ids, *, ended_by: dict[int, float],
          explained: Callable[[dict], bool] | None = None) -> dict:
    """Check every recorded execution against what the faults explain.

    ``ended_by`` maps the pid of each process the test killed (or stopped for good) to when
    it did: a run in such a process that logged no end ended then, and a second run of its
    task is explained. Returns counts, and the problems found: a task never run, a run that
    neither ended nor was killed, two runs of one task that overlapped, a duplicate run no
    kill explains. ``explained(run)`` may excuse a second run of a task by another fault
    than a kill (a database outage during the first run): it gets the earlier run.
    """
    by_task: dict[str, list[dict]] = {}
    for run in runs:
        by_task.setdefault(run["task_id"], []).append(run)
    problems = []
    duplicates = 0
    for task_id in task_ids:
        task_runs = sorted(by_task.get(task_id, []), key=lambda r: r["start"])
        if not task_runs:
            problems.append(f"{task_id}: never ran")
            continue
        for run in task_runs:
            if run["end"] is None:
                if run["pid"] not in ended_by:
                    problems.append(f"{task_id}: a run in pid {run['pid']} never ended")
                    run["end"] = float("inf")
                else:
                    run["end"] = ended_by[run["pid"]]
        for first, second in zip(task_runs, task_runs[1:]):
            if second["start"] < first["end"]:
                problems.append(f"{task_id}: runs in pids {first['pid']} and {second['pid']} "
                                f"overlapped")
            if first["pid"] not in ended_by and not (explained and explained(first)):
                problems.append(f"{task_id}: ran again though its run in pid {first['pid']} "
                                f"was not killed")
        duplicates += len(task_runs) - 1
    return {"tasks": len(task_ids), "runs": len(runs), "duplicates": duplicates,
            "problems": problems}
