"""Structured logs on stderr: one JSON object per line, or one compact text line on a terminal.

Every record carries ``ts``, ``level``, ``event`` and ``pid``; callers add the task fields the
seed asks for (``task_id``, ``worker_id``, ``task_type``, ``retry_count``, ``retry_delay``).
Records from other libraries pass through the same formatter, so stderr stays parseable; one
logged while a handler runs carries that task's ``task_id``, ``task_type`` and ``worker_id``,
even when its child runs many tasks at once (the context is per thread and per asyncio task),
and so does each line a handler prints (``handler_output``).

``logging.format``: ``json`` (what systemd's journal and log shippers read), ``text`` (for a
person: time, level, event, the task's fields first, colour on a terminal only) or ``auto``,
the default: text when stderr is a terminal, JSON otherwise. ``PGTASKD_LOG_FORMAT`` and
``PGTASKD_LOG_LEVEL`` in the environment win over the config, as ``PGTASKD_DSN`` does.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys
import time

LOGGER_NAME = "pgtaskd"
_logger = logging.getLogger(LOGGER_NAME)
# The task whose handler runs in this thread or asyncio task: what its own log lines carry.
_running_task: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "pgtaskd_running_task", default=None)


LEVEL_ENV = "PGTASKD_LOG_LEVEL"
FORMAT_ENV = "PGTASKD_LOG_FORMAT"
FORMATS = ("auto", "json", "text")
LEVELS = ("debug", "info", "warning", "error")


def enter_task(task_id: str, task_type: str, worker_id: str | None = None) -> contextvars.Token:
    """Records logged from here on in this context name the task (undo with leave_task)."""
    context = {"task_id": task_id, "task_type": task_type}
    if worker_id is not None:
        context["worker_id"] = worker_id
    return _running_task.set(context)


def leave_task(token: contextvars.Token | None = None) -> None:
    """The task's handler returned: what it printed without a newline is written out, and
    records are no longer its (``token`` None: a context of its own that simply ends)."""
    if isinstance(sys.stdout, TaskOutput):
        sys.stdout.end_of_task()
    if token is not None:
        _running_task.reset(token)


def _line(created: float, level: str, event: str, pid: int, fields: dict | None) -> dict:
    body = {"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
                  + f".{int(created * 1000) % 1000:03d}Z",
            "level": level, "event": event, "pid": pid}
    if fields:
        body.update(fields)
    return body


def _json(body: dict) -> str:
    return json.dumps(body, default=str, separators=(",", ":"))


# The fields a person looks for first, in this order; the rest follow as written.
_FIRST = ("task_id", "task_type", "worker_id")
_COLOURS = {"debug": "\033[2m", "warning": "\033[33m", "error": "\033[31m",
            "critical": "\033[1;31m"}
_SHORT = {"warning": "WARN", "critical": "CRIT"}
_PLAIN = re.compile(r"[^\s\"'=\x00-\x1f\x7f]+")


def _text_value(value) -> str:
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        text = ",".join(str(v) for v in value)
    else:
        text = value if isinstance(value, str) else json.dumps(value, default=str,
                                                               separators=(",", ":"))
    return text if _PLAIN.fullmatch(text) else json.dumps(text)


def _text(body: dict, colour: bool) -> str:
    """One line for a person: local time, level, pid, event, then key=value pairs."""
    created = body["ts"]
    level = body["level"]
    label = f"{_SHORT.get(level, level.upper()):<5}"
    if colour and level in _COLOURS:
        label = f"{_COLOURS[level]}{label}\033[0m"
    head = f"{created[11:23]} {label} [{body['pid']}] {body['event']}"
    rest = {k: v for k, v in body.items() if k not in ("ts", "level", "pid", "event")}
    if rest.get("message") == body["event"]:  # another library's record: its message is its event
        del rest["message"]
    pairs = [f"{k}={_text_value(rest.pop(k))}" for k in _FIRST if k in rest]
    pairs += [f"{k}={_text_value(v)}" for k, v in rest.items()]
    return " ".join([head, *pairs])


class JsonFormatter(logging.Formatter):
    """Formats every record as what emit() writes: JSON, or text (``text=True``)."""

    def __init__(self, text: bool = False, colour: bool = False):
        super().__init__()
        self.text = text
        self.colour = colour

    def render(self, body: dict) -> str:
        return _text(body, self.colour) if self.text else _json(body)

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
        return self.render(body)


def resolve_format(configured: str = "auto", stream=None) -> str:
    """``json`` or ``text``: the environment's choice, else the config's; ``auto`` asks
    whether the stream (stderr) is a terminal."""
    chosen = (os.environ.get(FORMAT_ENV) or configured or "auto").lower()
    if chosen not in FORMATS:
        chosen = "auto"
    if chosen == "auto":
        stream = sys.stderr if stream is None else stream
        try:
            chosen = "text" if stream.isatty() else "json"
        except (AttributeError, ValueError, OSError):
            chosen = "json"
    return chosen


def setup_logging(level: str | None = None, log_format: str = "auto") -> None:
    """Send every log record to stderr, as JSON or text; called again (once the config is
    read), it only changes the level and the format."""
    # Every task logs two events; what logging gathers by default for each record (the
    # caller's file and line from a stack walk, thread and process names) would cost more
    # than running a short task. None of it is in our records.
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    global _direct, _render
    handler = next((h for h in root.handlers if getattr(h, "_pgtaskd", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler._pgtaskd = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    text = resolve_format(log_format, handler.stream) == "text"
    formatter = JsonFormatter(text=text, colour=text and _is_tty(handler.stream))
    handler.setFormatter(formatter)
    _direct, _render = handler, formatter.render
    root.setLevel((os.environ.get(LEVEL_ENV) or level or "INFO").upper())
    # The pool logs every reconnect attempt at warning with a traceback; our own
    # loop_error / db_unreachable events already say it once.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


# The handler setup_logging installed, and how it renders a line: emit() writes through it
# directly while nothing else listens to pgtaskd's events, which halves the cost of a line
# (a task logs two).
_direct: logging.StreamHandler | None = None
_render = _json
_LEVEL_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warning",
                logging.ERROR: "error", logging.CRITICAL: "critical"}


def emit(event: str, level: int = logging.INFO, exc_info=None, **fields) -> None:
    """Log one named event with its fields; None-valued fields are left out."""
    clean = {k: v for k, v in fields.items() if v is not None}
    handler = _direct
    if handler is not None and exc_info is None and not _logger.handlers \
            and level in _LEVEL_NAMES and _logger.isEnabledFor(level) \
            and level >= handler.level:
        line = _render(_line(time.time(), _LEVEL_NAMES[level], event, os.getpid(), clean))
        with handler.lock:
            try:
                handler.stream.write(line + "\n")
                handler.stream.flush()
            except (OSError, ValueError):
                pass  # a closed or full stderr must not stop a worker
        return
    _logger.log(level, event, extra={"event": event, "fields": clean}, exc_info=exc_info)


class TaskOutput:
    """The worker's stdout: a line a handler prints while its task runs becomes a
    ``handler_output`` record with the task's fields; anything else goes to the stream as it
    was. Lines are gathered per task context, so concurrent tasks never mix their output."""

    def __init__(self, stream):
        self._stream = stream
        self._partial: dict[int, str] = {}

    def write(self, text: str) -> int:
        task = _running_task.get()
        if task is None:
            return self._stream.write(text)
        key = id(task)
        buffered = self._partial.pop(key, "") + text
        *lines, rest = buffered.split("\n")
        if rest:
            self._partial[key] = rest
        for line in lines:
            emit("handler_output", message=line, **task)
        return len(text)

    def end_of_task(self) -> None:
        task = _running_task.get()
        if task is not None and id(task) in self._partial:
            emit("handler_output", message=self._partial.pop(id(task)), **task)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


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
