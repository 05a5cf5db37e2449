"""A long task that cooperates with cancellation.

A database update cannot stop Python code that is already running. This handler checks at
safe points, between steps, and stops there once its task was cancelled (or its lease lost).
Work done by earlier steps stays done: cancellation does not undo it.

Payload: {"steps": 10, "step_seconds": 0.5}
"""

import time


def handle(task):
    steps = int(task.payload.get("steps", 10))
    step_seconds = float(task.payload.get("step_seconds", 0.5))
    for _ in range(steps):
        task.raise_if_cancelled()
        time.sleep(step_seconds)  # one unit of real work would go here
    task.raise_if_cancelled()
