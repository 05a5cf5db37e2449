"""How the ``pgtaskd`` commands print: JSON for scripts, tables and fields for people.

Text from the database passes through ``printable`` before it reaches a terminal, so that a
task id or payload cannot drive it; ``print_json`` gives scripts one shape for every task.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from ..db.loaders import StoredJson


def print_json(value) -> None:
    """JSON on stdout: ASCII-only, so any terminal or pipe carries it intact.

    A task's StoredJson payload is written as the JSON text it is, not as a string: scripts
    get the same shape for every task, and the value PostgreSQL holds, digit for digit.
    """
    stored: list[str] = []

    def marked(task):
        if isinstance(task, dict) and isinstance(task.get("payload"), StoredJson):
            stored.append(task["payload"])
            return {**task, "payload": _stored_marker(len(stored) - 1)}
        return task

    value = [marked(task) for task in value] if isinstance(value, list) else marked(value)
    text = json.dumps(value, default=_json_value, indent=2)
    for index, payload in enumerate(stored):
        text = text.replace(json.dumps(_stored_marker(index)), _ascii_json(payload), 1)
    print(text)


def _stored_marker(index: int) -> str:
    # jsonb cannot hold U+0000, so no real value is ever printed as this.
    return f"\x00stored payload {index}\x00"


def _ascii_json(text: str) -> str:
    """JSON text with every non-ASCII character escaped (they occur only inside strings)."""
    return re.sub(r"[^\x00-\x7f]", lambda m: json.dumps(m[0])[1:-1], text)


class OutputLost(Exception):
    """What a command did could not be printed, and the operator must know what it did."""


def _json_value(value):
    if isinstance(value, datetime):
        try:
            return value.astimezone(timezone.utc).isoformat()
        except OverflowError:
            return value.isoformat()  # in UTC it would be before year 1: its own offset
    raise TypeError(f"cannot print {type(value).__name__} as JSON")


def human_time(value: datetime | str | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):  # a time a datetime cannot hold, as PostgreSQL writes it
        return value
    try:
        utc = value.astimezone(timezone.utc)
    except OverflowError:
        # Loaded in a session zone east of UTC, a time just before year 1 in UTC is a time
        # of year 1 there: shown with the offset it came with.
        return value.isoformat(timespec="seconds")
    # isoformat, not strftime: %Y writes year 1 as "1".
    return utc.replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


def printable(text: str) -> str:
    """Text with control characters escaped: a task id must not drive the terminal."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in str(text))


def render_table(headers: list[str], rows: list[list[str]], *,
                 right_aligned: set[str] = frozenset()) -> str:
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(cells[i]) for cells in [headers, *rows]) for i in range(len(headers))]
    lines = []
    for cells in [headers, *rows]:
        padded = [cell.rjust(width) if header in right_aligned else cell.ljust(width)
                  for header, cell, width in zip(headers, cells, widths)]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def shown(column: str, value) -> str:
    """One field of a task as ``pgtaskd show`` prints it."""
    if isinstance(value, StoredJson):
        return str(value)
    if column == "payload":
        return json.dumps(value, indent=2, ensure_ascii=False)
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return human_time(value)
    return str(value)
