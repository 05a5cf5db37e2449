"""How rows come back: jsonb and timestamptz read so that no value a client may have stored
makes a query fail to load, and the cursor every named query runs on."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import set_json_loads


class StoredJson(str):
    """A payload Python's json module cannot read, as the JSON text PostgreSQL returned.

    jsonb takes integers past Python's 4300-digit limit, numbers past a float's range (which
    Python would read as inf, and print as the non-JSON Infinity) and nesting past Python's
    recursion limit. A row holding one is still a task to show, cancel or retry: failing the
    read would hide it, and every row listed with it. ``reason`` says what Python refused.
    """

    reason: str

    def __new__(cls, text: str, reason: str) -> "StoredJson":
        instance = super().__new__(cls, text)
        instance.reason = reason
        return instance


def read_json(data: bytes) -> Any:
    """jsonb as Python values, or as a StoredJson when Python's json cannot read it."""
    try:
        return json.loads(data, parse_float=_finite_float)
    except RecursionError:
        return StoredJson(data.decode("utf-8"), "nested deeper than Python's json reads")
    except ValueError as exc:
        return StoredJson(data.decode("utf-8"), str(exc).split(";")[0])


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"a number of {len(text)} characters, past the range of a float")
    return value


class TimeOrText(TimestamptzLoader):
    """timestamptz as a datetime, or as PostgreSQL's text where a datetime cannot hold it
    ('infinity', a year past 9999 or before 1), which any client may have written: the task
    is still shown. Python code, so only the queries that show whole rows use it (and the
    claim, TimeOrNone, whose few rows each carry two times)."""

    def load(self, data) -> datetime | str:
        try:
            return super().load(data)
        except psycopg.DataError:
            return bytes(data).decode()


class TimeOrNone(TimestamptzLoader):
    """timestamptz as a datetime, or None where a datetime cannot hold it: how a claim's
    times reach the worker. The claim has committed by the time its rows are read, so a time
    that failed to load (a year past 9999 or before 1, which any client may have written)
    would orphan every task of the batch; it reaches the handler as an infinite one does."""

    def load(self, data) -> datetime | None:
        try:
            return super().load(data)
        except psycopg.DataError:
            return None


# How timestamptz columns load: psycopg's loader, or one that keeps any stored time.
TimeLoader = type[TimestamptzLoader] | None


def cursor(conn: psycopg.Connection, *, times: TimeLoader) -> psycopg.Cursor:
    cur = conn.cursor(row_factory=dict_row)
    set_json_loads(read_json, cur)
    if times is not None:
        cur.adapters.register_loader("timestamptz", times)
    return cur
