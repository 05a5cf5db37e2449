"""Structured logs: one JSON object per line on stderr.

Every record carries ``ts``, ``level``, ``event`` and ``pid``; callers add the task fields the
seed asks for (``task_id``, ``worker_id``, ``task_type``, ``retry_count``, ``retry_delay``).
Records from other libraries pass through the same formatter, so stderr stays parseable.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

LOGGER_NAME = "pgtaskd"
_logger = logging.getLogger(LOGGER_NAME)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        body = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
                  + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": getattr(record, "event", None) or record.getMessage(),
            "pid": record.process,
        }
        fields = getattr(record, "fields", None)
        if fields:
            body.update(fields)
        elif record.name != LOGGER_NAME:
            body["logger"] = record.name
            body["message"] = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            body["exception"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(body, default=str, separators=(",", ":"))


def setup_logging(level: str | None = None) -> None:
    """Send every log record to stderr as JSON; idempotent."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_pgtaskd", False):
            return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._pgtaskd = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level or os.environ.get("PGTASKD_LOG_LEVEL", "INFO").upper())
    # The pool logs every reconnect attempt at warning with a traceback; our own
    # loop_error / db_unreachable events already say it once.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


def emit(event: str, level: int = logging.INFO, exc_info=None, **fields) -> None:
    """Log one named event with its fields; None-valued fields are left out."""
    clean = {k: v for k, v in fields.items() if v is not None}
    _logger.log(level, event, extra={"event": event, "fields": clean}, exc_info=exc_info)
