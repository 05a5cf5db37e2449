"""Example tasks for ``pgtaskd run --demo``: something to watch on a first run."""

from __future__ import annotations

import uuid

from ..db import store
from ..logs import emit

DEMO_TASKS = [
    ("echo", {"message": "hello from pgtaskd"}, 0),
    ("echo", {"message": "high priority runs first"}, 10),
    ("charge", {"account": "acme", "amount_cents": 1250}, 0),
    ("flaky", {"fail_times": 2}, 0),
    ("flaky", {"permanent": True}, 0),
    ("report", {"steps": 6, "step_seconds": 0.5}, 0),
] + [("notify", {"to": f"user-{n}", "latency": 0.5}, 0) for n in range(5)]


def submit_demo_tasks(conn) -> list[str]:
    ids = []
    for task_type, payload, priority in DEMO_TASKS:
        task_id = f"demo-{task_type}-{uuid.uuid4().hex[:8]}"
        store.insert_task(conn, task_id=task_id, name=f"demo {task_type}", task_type=task_type,
                          payload=payload, priority=priority)
        ids.append(task_id)
    emit("demo_tasks_submitted", task_ids=ids)
    return ids
