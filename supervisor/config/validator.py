"""Typed readers of a parsed YAML tree that record each problem with its key path.

A reader that finds a bad value records one line (``pools.fast.processes: must be ...``) and
returns the default, so that validation goes on and ``pgtaskd check-config`` can list every
problem of a file at once.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping

from ..db.redact import dsn_problem
from ..errors import UsageError, one_line, quote
from ..task_fields import check_task_type
from .defaults import MAX_RETENTION_SECONDS, MAX_SECONDS


class Validator:
    """Reads a parsed YAML tree, collecting one problem per bad key path."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.problems: list[str] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def section(self, tree: Mapping, key: str, path: str, allowed: set[str]) -> dict:
        value = tree.get(key, {})
        full = f"{path}.{key}" if path else key
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.problem(full, f"must be a mapping, got {type_name(value)}")
            return {}
        self.unknown(value, full, allowed)
        return value

    def unknown(self, tree: Mapping, path: str, allowed: set[str]) -> None:
        for key in tree:
            if key not in allowed:
                where = f"{path}.{shown_key(key)}" if path else shown_key(key)
                self.problem(where, f"unknown key (allowed: {', '.join(sorted(allowed))})")

    def number(self, tree: Mapping, key: str, path: str, default: float, *,
               minimum: float = 0.0, strict: bool = True,
               maximum: float = MAX_SECONDS, hint: str = "", unit: str = "seconds") -> float:
        """``hint``, if given, ends every problem line about this key."""
        if key not in tree or tree[key] is None:
            return default
        value = tree[key]
        full = f"{path}.{key}" if path else key
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.problem(full, f"must be a number of {unit}{hint}, got {type_name(value)} "
                               f"{quote(value)}")
            return default
        # An integer is finite, and may be too large for math.isfinite() to convert.
        if isinstance(value, float) and not math.isfinite(value):
            self.problem(full, f"must be a finite number{hint}, got {quote(value)}")
            return default
        if (strict and value <= minimum) or (not strict and value < minimum):
            bound = "greater than" if strict else "at least"
            self.problem(full, f"must be {bound} {minimum:g}{hint}, got {quote(value)}")
            return default
        if value > maximum:
            self.problem(full, f"must be at most {maximum:g}{hint}, got {quote(value)}")
            return default
        return float(value)

    def retention(self, tree: Mapping, key: str, path: str, default: float) -> float | None:
        """A retention period in seconds, or None for ``false``: keep forever."""
        if tree.get(key) is False:
            return None
        return self.number(tree, key, path, default, maximum=MAX_RETENTION_SECONDS,
                           hint=" (or false to keep these tasks forever)")

    def task_type(self, where: str, name: Any) -> bool:
        """Whether ``name`` is a task type a client could submit; if not, one problem says
        why, in the client's own words."""
        try:
            check_task_type(name)
        except UsageError as exc:
            self.problem(where, str(exc).partition("task_type: ")[2])
            return False
        return True

    def boolean(self, tree: Mapping, key: str, path: str, default: bool) -> bool:
        if key not in tree or tree[key] is None:
            return default
        value = tree[key]
        if not isinstance(value, bool):
            self.problem(f"{path}.{key}" if path else key,
                         f"must be true or false, got {type_name(value)} {quote(value)}")
            return default
        return value

    def integer(self, tree: Mapping, key: str, path: str, default: int, *, minimum: int,
                maximum: int) -> int:
        if key not in tree or tree[key] is None:
            return default
        value = tree[key]
        full = f"{path}.{key}" if path else key
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(full, f"must be a whole number, got {type_name(value)} {quote(value)}")
            return default
        if not minimum <= value <= maximum:
            self.problem(full, f"must be from {minimum} to {maximum}, got {quote(value)}")
            return default
        return value

    def choice(self, tree: Mapping, key: str, path: str, default: str,
               choices: tuple[str, ...]) -> str:
        value = self.string(tree, key, path, default)
        if value is None or value.lower() not in choices:
            if value is not None:
                self.problem(f"{path}.{key}" if path else key,
                             f"must be one of {', '.join(choices)}, got {quote(value)}")
            return default
        return value.lower()

    def string(self, tree: Mapping, key: str, path: str, default: str | None) -> str | None:
        if key not in tree or tree[key] is None:
            return default
        value = tree[key]
        if not isinstance(value, str):
            self.problem(f"{path}.{key}" if path else key,
                         f"must be a string, got {type_name(value)}")
            return default
        return value

    def directory(self, tree: Mapping, key: str, path: str, default: str) -> Path:
        raw = self.string(tree, key, path, default) or default
        if "\x00" in raw:  # the OS cannot take it, and Path.resolve() raises on it
            self.problem(f"{path}.{key}", "must not hold a NUL character")
            raw = default
        try:
            os.fsencode(raw)
        except UnicodeEncodeError as exc:  # a lone surrogate, from a YAML "\ud800" escape
            self.problem(f"{path}.{key}", f"holds a character no file name can: "
                                          f"{raw[exc.start:exc.end]!r}")
            raw = default
        candidate = Path(os.path.expanduser(raw))
        if candidate.is_absolute():
            return candidate
        try:
            return (self.base_dir / candidate).resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop, a folder we may not read
            self.problem(f"{path}.{key}", f"cannot be resolved: {one_line(exc)}")
            return self.base_dir / candidate

    def dsn(self, where: str, dsn: str | None) -> str | None:
        """The DSN, after recording why libpq could not read it (no part of its password)."""
        problem = dsn_problem(dsn) if dsn else None
        if problem:
            self.problem(where, problem)
        return dsn


def shown_key(key: Any) -> str:
    """A mapping key as a key path shows it: as written if it is a short string that reads
    the same in a line of text (no white space at its ends, which would vanish there)."""
    if (isinstance(key, str) and 0 < len(key) <= 60 and key.isprintable()
            and key == key.strip()):
        return key
    return quote(key)


def type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean",
            int: "integer", float: "number", type(None): "null"}.get(type(value), type(value).__name__)
