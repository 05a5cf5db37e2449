"""Loads the named SQL blocks of ``queries.sql`` once, into ``QUERIES[name]``."""

from __future__ import annotations

import re
from importlib import resources

_NAME_LINE = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    text = resources.files(__package__).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME_LINE.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    queries = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in queries:
            raise RuntimeError(f"queries.sql names {name!r} twice")
        queries[name] = body.strip()
    return queries


QUERIES: dict[str, str] = _load()
