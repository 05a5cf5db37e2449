"""An I/O-bound handler: deliver a notification, waiting on the network without holding a
process. It is ``async def``, so a pool with ``concurrency: 50`` runs fifty at once on one
event loop in each child.

The delivery is keyed by ``task.idempotency_key`` (the task id), which a receiving service can
use to drop a second delivery of the same task: a run may repeat after a crash. The wait here
stands for the request; a real handler awaits an async HTTP client in its place, and checks
``task.is_cancelled()`` between steps like any long handler.
"""

import asyncio
import json
import sys


async def handle(task):
    await asyncio.sleep(float(task.payload.get("latency", 0.1)))
    task.raise_if_cancelled()
    print(json.dumps({"event": "notified", "task_id": task.id, "key": task.idempotency_key,
                      "to": task.payload.get("to")}), file=sys.stderr, flush=True)
