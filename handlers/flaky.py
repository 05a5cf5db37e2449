"""A handler that fails on purpose, to watch retries with backoff and the FAILED state.

Payload: {"fail_times": 2}  fails the first two runs, then succeeds
         {"permanent": true} fails at once, without retries
"""

from supervisor import PermanentError


def handle(task):
    if task.payload.get("permanent"):
        raise PermanentError("asked to fail permanently")
    if task.retry_count < int(task.payload.get("fail_times", 1)):
        raise RuntimeError(f"simulated temporary failure on run {task.retry_count + 1}")
