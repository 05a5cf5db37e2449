"""The smallest handler: log the payload. Safe to run any number of times."""

import json
import sys


def handle(task):
    print(json.dumps({"event": "echo", "task_id": task.id, "payload": task.payload}),
          file=sys.stderr, flush=True)
