"""Cron expressions in a time zone: which instants they name, daylight saving included.

An expression is read by cronsim: 5 fields (minute hour day-of-month month day-of-week), or 6
with seconds first (``*/10 * * * * *``: every ten seconds), or one of ``@hourly``, ``@daily``,
``@weekly``, ``@monthly``, ``@yearly``. It is evaluated on the wall clock of an IANA time zone,
and every instant it names comes out as an aware UTC datetime of whole seconds.

Daylight saving follows Debian's cron, which operators already know:

- An expression that names its minute and its hour (``30 2 * * *``, ``0 0 9 * * 1-5``) is a
  time on the wall clock. A wall time the clock skips (02:30 on a spring-forward night in New
  York) runs once, at the first instant after the gap (03:00 EDT); a wall time the clock shows
  twice (01:30 on a fall-back night) runs once, the first time.
- An expression whose minute or hour field starts with ``*`` (``*/15 * * * *``, ``0 * * * *``,
  every second) is a rhythm of elapsed time: it runs at each matching instant of real time, so
  an hourly schedule runs in both 01:00 hours of a fall-back night, and not in an hour that did
  not exist.

cronsim applies the first rule itself only to 5-field expressions, and its walk through a
zone's transitions skips instants where the clock moves by half an hour. So cronsim only walks
a clock without a zone here, and each wall time it names is placed on the time line by
``_placements``: once (the first rule), or each time the clock shows it (the second).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import MAXYEAR, MINYEAR, datetime, timedelta, timezone
from functools import cached_property
from typing import Iterator
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

UTC = timezone.utc
SECOND = timedelta(seconds=1)

ALIASES = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# A cron expression is a line of a few short fields; anything much longer is a mistake.
MAX_EXPRESSION_LENGTH = 200
# Where validation looks for a first instant: any fixed moment does, since cron has no year.
_PROBE_START = datetime(2000, 1, 1)
# How far a search walks before it answers "none": as far as cronsim looks for a date. Cronsim
# only knows the wall clock, so an expression whose every wall time the zone skips (``* 2 * 3
# 0#2`` in New York) gives it matches for ever, which each placed nowhere: unbounded, a search
# walked to the year 9999 and overflowed.
HORIZON_YEARS = 50
# An instant and its wall time are less than a day apart (UTC offsets are within +-14 h).
_OFFSET_SLACK = timedelta(days=1)


class CronError(ValueError):
    """Why an expression or a time zone cannot be used: one line, without the key path."""


def check_expression(expression: object) -> str:
    """The expression as cronsim reads it (an alias spelled out, 6 fields or 5), or CronError."""
    if not isinstance(expression, str):
        raise CronError("must be a string (quote it in YAML, like '*/5 * * * *')")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CronError(f"longer than {MAX_EXPRESSION_LENGTH} characters")
    text = " ".join(expression.split())
    text = ALIASES.get(text.lower(), text)
    fields = text.split(" ") if text else []
    if len(fields) not in (5, 6):
        raise CronError(f"has {len(fields)} fields where a cron expression has 5 (minute hour "
                        f"day-of-month month day-of-week) or 6 (a seconds field first)")
    try:
        first = next(CronSim(text, _PROBE_START), None)
    except CronSimError as exc:
        raise CronError(f"not a cron expression: {str(exc).lower()} field") from None
    except (ValueError, IndexError, KeyError, TypeError):  # cronsim trusts some input shapes
        raise CronError("not a cron expression") from None
    if first is None:
        raise CronError("names no date that exists (within 50 years)")
    return text


def load_zone(name: object) -> ZoneInfo:
    """The IANA time zone of this name, or CronError."""
    if not isinstance(name, str) or not name:
        raise CronError("must be an IANA time zone name, like Europe/Paris or UTC")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ZoneInfo refuses paths with ValueError and a folder name (America) with an OSError.
        raise CronError(f"unknown time zone {name[:60]!r} (an IANA name, like Europe/Paris "
                        f"or America/New_York)") from None


@dataclass(frozen=True)
class Cron:
    """A cron expression on the wall clock of a time zone. Compared by its text and zone name;
    constructing one checks both (CronError)."""

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        # Read now, so that a bad expression or zone fails where the Cron is made.
        check_expression(self.expression)
        load_zone(self.timezone)

    @cached_property
    def _text(self) -> str:
        return check_expression(self.expression)

    @cached_property
    def zone(self) -> ZoneInfo:
        return load_zone(self.timezone)

    @cached_property
    def on_wall_clock(self) -> bool:
        """True when the expression names its minute and hour: a wall-clock time (see the
        module's docstring); False for a rhythm of elapsed time. Debian cron's test."""
        fields = self._text.split(" ")
        minute, hour = (fields[0], fields[1]) if len(fields) == 5 else (fields[1], fields[2])
        return not minute.startswith("*") and not hour.startswith("*")

    # -- the instants -----------------------------------------------------------------------

    def next_after(self, instant: datetime) -> datetime | None:
        """The first instant strictly after ``instant``; None if there is none within
        HORIZON_YEARS (or before the calendar ends)."""
        return next(self._forward(instant), None)

    def newest(self, after: datetime, until: datetime, count: int | None = None) -> list[datetime]:
        """The instants in (after, until], oldest first; only the newest ``count`` if given.

        Walks back from ``until``, so the cost is the number of instants returned, however
        long ago ``after`` was (a schedule every second, missed for a month)."""
        found: list[datetime] = []
        if count == 0:
            return found
        for instant in self._backward(until, after):
            if instant <= after:
                break
            found.append(instant)
            if count is not None and len(found) >= count:
                break
        found.reverse()
        return found

    def _forward(self, after: datetime) -> Iterator[datetime]:
        """Instants strictly after ``after``, ascending, each once."""
        after = after.astimezone(UTC)
        pending: list[datetime] = []
        start = self._forward_start(after)
        for wall, placed in self._walls(start, _years_from(start, HORIZON_YEARS)):
            # A later wall time never runs before this one's first placement, but the second
            # pass of a repeated hour runs after wall times that come later: hold each
            # instant until nothing can come before it.
            pending = sorted(pending + placed)
            while pending and pending[0] <= placed[0]:
                instant = pending.pop(0)
                # Gap ends are shared by every skipped wall time: give each instant once.
                if instant > after:
                    yield instant
                    after = instant
        yield from (instant for instant in pending if instant > after)

    def _backward(self, until: datetime, after: datetime) -> Iterator[datetime]:
        """Instants at or before ``until``, descending, each once, down to about ``after``
        (HORIZON_YEARS at most): the caller stops at ``after`` itself."""
        until = until.astimezone(UTC)
        pending: list[datetime] = []
        previous = None
        start = self._backward_start(until)
        try:
            lowest = after.astimezone(self.zone).replace(tzinfo=None) - _OFFSET_SLACK
        except OverflowError:
            lowest = datetime.min
        lowest = max(lowest, _years_from(start, -HORIZON_YEARS))
        for wall, placed in self._walls(start, lowest, reverse=True):
            pending = sorted(pending + placed)
            while pending and pending[-1] >= placed[-1]:
                instant = pending.pop()
                if instant <= until and (previous is None or instant < previous):
                    yield instant
                    previous = instant

    def _forward_start(self, after: datetime) -> datetime:
        """The wall time to walk forward from: that of ``after``, or, in the first pass of a
        repeated hour, the hour's start, whose second pass is still to come."""
        local = after.astimezone(self.zone)
        second_pass = local.replace(fold=1).astimezone(UTC)
        if second_pass > after:
            repeat = self._first_change(after, second_pass)
            return repeat.astimezone(self.zone).replace(tzinfo=None) - SECOND
        return local.replace(tzinfo=None)

    def _backward_start(self, until: datetime) -> datetime:
        """The wall time to walk back from (cronsim starts one second before it): just after
        that of ``until``, or, in the second pass of a repeated hour, just after the end of
        its first pass, whose later wall times all ran before ``until``."""
        last = until.replace(microsecond=0)
        local = until.astimezone(self.zone)
        if local.fold:
            first_pass = local.replace(fold=0).astimezone(UTC)
            last = self._first_change(first_pass, until) - SECOND
        return last.astimezone(self.zone).replace(tzinfo=None) + SECOND

    def _walls(self, start: datetime, limit: datetime, *,
               reverse: bool = False) -> Iterator[tuple[datetime, list[datetime]]]:
        """Each wall time cronsim names from ``start`` (exclusive) on to ``limit``, with its
        placements; a skipped stretch of wall times is passed over at once, so the cost is
        that of the wall times placed, and nothing is searched past ``limit``."""
        while True:
            try:
                for wall in CronSim(self._text, start, reverse=reverse):
                    if (wall < limit) if reverse else (wall > limit):
                        return
                    placed = self._placements(wall)
                    if placed:
                        yield wall, placed
                        continue
                    # A rhythm's wall time in a gap runs never: go on from the gap's edge.
                    end = self._gap_end(wall)
                    start = self._wall(end) - SECOND if not reverse else \
                        self._wall(end - SECOND) + SECOND
                    break
                else:
                    return  # cronsim found no date within its own 50 years
            except (OverflowError, ValueError):
                # The calendar's end (year 1 or 9999) came first: nothing lies past it.
                return

    def _wall(self, instant: datetime) -> datetime:
        return instant.astimezone(self.zone).replace(tzinfo=None)

    # -- wall clock to time line ------------------------------------------------------------

    def _placements(self, wall: datetime) -> list[datetime]:
        """The UTC instants at which a naive wall time of the zone runs, ascending."""
        if self.on_wall_clock:
            return [self._place(wall)]
        # Elapsed time: each moment the clock shows it, so twice, once or never.
        instants = {wall.replace(tzinfo=self.zone, fold=fold).astimezone(UTC) for fold in (0, 1)}
        return sorted(t for t in instants if t.astimezone(self.zone).replace(tzinfo=None) == wall)

    def _place(self, wall: datetime) -> datetime:
        """The UTC instant at which a naive wall time of the zone runs: the first of two in a
        repeated hour, the end of the gap for a time the clock skipped."""
        earliest = min(wall.replace(tzinfo=self.zone, fold=fold).astimezone(UTC)
                       for fold in (0, 1))
        if earliest.astimezone(self.zone).replace(tzinfo=None) == wall:
            return earliest
        return self._gap_end(wall)

    def _gap_end(self, wall: datetime) -> datetime:
        """The first instant after the gap that skips this naive wall time."""
        first = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        # ``earliest`` reads the wall time with the offset after the jump, so it lies before
        # the jump, and ``latest`` after it.
        return self._first_change(min(first, second), max(first, second))

    def _first_change(self, before: datetime, after: datetime) -> datetime:
        """The first whole second in (before, after] whose UTC offset differs from that of
        ``before``: the one transition known to lie between them (found by bisection)."""
        offset = before.astimezone(self.zone).utcoffset()
        low, high = int(before.timestamp()), int(after.timestamp())
        while high - low > 1:
            middle = (low + high) // 2
            if datetime.fromtimestamp(middle, UTC).astimezone(self.zone).utcoffset() == offset:
                low = middle
            else:
                high = middle
        return datetime.fromtimestamp(high, UTC)


def _years_from(wall: datetime, years: int) -> datetime:
    """The same wall time ``years`` later (earlier if negative), held within the calendar."""
    year = wall.year + years
    if year > MAXYEAR:
        return datetime.max
    if year < MINYEAR:
        return datetime.min
    if (wall.month, wall.day) == (2, 29):
        wall = wall.replace(day=28)
    return wall.replace(year=year)
