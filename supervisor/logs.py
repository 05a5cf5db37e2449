"""Structured logs: one JSON object per line on stderr.

Every record carries ``ts``, ``level``, ``event`` and ``pid``; callers add the task fields the
seed asks for (``task_id``, ``worker_id``, ``task_type``, ``retry_count``, ``retry_delay``).
Records from other libraries pass through the same formatter, so stderr stays parseable; one
logged while a handler runs carries that task's ``task_id`` and ``task_type``, even when its
child runs many tasks at once (the context is per thread and per asyncio task).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time

LOGGER_NAME = "pgtaskd"
_logger = logging.getLogger(LOGGER_NAME)
# The task whose handler runs in this thread or asyncio task: what its own log lines carry.
_running_task: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "pgtaskd_running_task", default=None)


def enter_task(task_id: str, task_type: str) -> contextvars.Token:
    """Records logged from here on in this context name the task (undo with leave_task)."""
    return _running_task.set({"task_id": task_id, "task_type": task_type})


def leave_task(token: contextvars.Token) -> None:
    _running_task.reset(token)


def _line(created: float, level: str, event: str, pid: int, fields: dict | None) -> dict:
    body = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
                  + f".{int(created * 1000) % 1000:03d}Z",
            "level": level, "event": event, "pid": pid}
    if fields:
        body.update(fields)
    return body


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = _line(record.created, record.levelname.lower(),
                     getattr(record, "event", None) or record.getMessage(),
                     record.process or os.getpid(), None)
        fields = getattr(record, "fields", None)
        if fields:
            body.update(fields)
        elif record.name != LOGGER_NAME:
            body["logger"] = record.name
            body["message"] = record.getMessage()
            task = _running_task.get()
            if task is not None:
                body.update(task)
        if record.exc_info and record.exc_info[0] is not None:
            body["exception"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(body, default=str, separators=(",", ":"))


def setup_logging(level: str | None = None) -> None:
    """Send every log record to stderr as JSON; idempotent."""
    # Every task logs two events; what logging gathers by default for each record (the
    # caller's file and line from a stack walk, thread and process names) would cost more
    # than running a short task. None of it is in our records.
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_pgtaskd", False):
            return
    global _direct
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._pgtaskd = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    _direct = handler
    root.setLevel(level or os.environ.get("PGTASKD_LOG_LEVEL", "INFO").upper())
    # The pool logs every reconnect attempt at warning with a traceback; our own
    # loop_error / db_unreachable events already say it once.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


# The JSON handler setup_logging installed: emit() writes through it directly while nothing
# else listens to pgtaskd's events, which halves the cost of a line (a task logs two).
_direct: logging.StreamHandler | None = None
_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning",
                logging.ERROR: "error", logging.CRITICAL: "critical"}


def emit(event: str, level: int = logging.INFO, exc_info=None, **fields) -> None:
    """Log one named event with its fields; None-valued fields are left out."""
    clean = {k: v for k, v in fields.items() if v is not None}
    handler = _direct
    if handler is not None and exc_info is None and not _logger.handlers \
            and level in _LEVEL_NAMES and _logger.isEnabledFor(level) \
            and level >= handler.level:
        line = json.dumps(_line(time.time(), _LEVEL_NAMES[level], event, os.getpid(), clean),
                          default=str, separators=(",", ":"))
        with handler.lock:
            try:
                handler.stream.write(line + "\n")
                handler.stream.flush()
            except (OSError, ValueError):
                pass  # a closed or full stderr must not stop a worker
        return
    _logger.log(level, event, extra={"event": event, "fields": clean}, exc_info=exc_info)


def print_text(text: str) -> None:
    """Text as it is (a traceback, for ``pgtaskd worker``), on the stream the JSON lines go
    to, under the same lock: it never splits one of them."""
    handler = _direct
    stream = handler.stream if handler is not None else sys.stderr
    lock = handler.lock if handler is not None else None
    try:
        if lock is not None:
            lock.acquire()
        try:
            stream.write(text if text.endswith("\n") else text + "\n")
            stream.flush()
        finally:
            if lock is not None:
                lock.release()
    except (OSError, ValueError):
        pass  # a closed or full stderr must not stop a worker
