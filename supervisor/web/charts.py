"""The overview's charts as inline SVG made on the server: no script draws them, so they
show with no JavaScript library and no network, and a live update replaces them whole."""

from __future__ import annotations

from datetime import datetime
from html import escape

WIDTH, HEIGHT, TOP = 600, 120, 14


def _label(minute: datetime) -> str:
    return f"{minute:%H:%M}"


def _scale(values: list[int | None]) -> int:
    top = max((v for v in values if v), default=0)
    return max(top, 1)


def activity_chart(minutes: list[dict]) -> str:
    """Completed and failed tasks per minute, as bars (failed stacked on completed)."""
    if not minutes:
        return ""
    totals = [(m["completed"] or 0) + (m["failed"] or 0) for m in minutes]
    top = _scale(totals)
    step = WIDTH / len(minutes)
    parts = [_frame("Completed and failed tasks per minute", top, minutes)]
    for index, minute in enumerate(minutes):
        x = index * step
        if minute["completed"] is None:
            parts.append(f'<rect class="gap" x="{x:.1f}" y="{TOP}" width="{step - 1:.1f}" '
                         f'height="{HEIGHT - TOP}"><title>{_label(minute["minute"])}: not '
                         f'rolled up</title></rect>')
            continue
        done, failed = minute["completed"], minute["failed"]
        done_h = (HEIGHT - TOP) * done / top
        failed_h = (HEIGHT - TOP) * failed / top
        title = f"{_label(minute['minute'])}: {done} completed, {failed} failed"
        parts.append(f'<g><title>{escape(title)}</title>'
                     f'<rect class="done" x="{x:.1f}" y="{HEIGHT - done_h:.1f}" '
                     f'width="{step - 1:.1f}" height="{done_h:.1f}"/>'
                     f'<rect class="failed" x="{x:.1f}" y="{HEIGHT - done_h - failed_h:.1f}" '
                     f'width="{step - 1:.1f}" height="{failed_h:.1f}"/></g>')
    parts.append("</svg>")
    return "".join(parts)


def depth_chart(minutes: list[dict]) -> str:
    """Due tasks at the end of each minute, as a line (broken where no daemon sampled)."""
    if not minutes:
        return ""
    top = _scale([m["due"] for m in minutes])
    step = WIDTH / max(len(minutes) - 1, 1)
    parts = [_frame("Due tasks (queue depth), sampled each minute", top, minutes)]
    line: list[str] = []
    for index, minute in enumerate(minutes):
        if minute["due"] is None:
            parts.append(_polyline(line))
            line = []
            continue
        x, y = index * step, HEIGHT - (HEIGHT - TOP) * minute["due"] / top
        line.append(f"{x:.1f},{y:.1f}")
        more = "at least " if minute["due_at_least"] else ""
        parts.append(f'<circle class="depth" cx="{x:.1f}" cy="{y:.1f}" r="2"><title>'
                     f'{_label(minute["minute"])}: {more}{minute["due"]} due, '
                     f'{minute["running"]} running</title></circle>')
    parts.append(_polyline(line))
    parts.append("</svg>")
    return "".join(parts)


def _polyline(points: list[str]) -> str:
    if len(points) < 2:
        return ""
    return f'<polyline class="depth" points="{" ".join(points)}"/>'


def _frame(title: str, top: int, minutes: list[dict]) -> str:
    first, last = _label(minutes[0]["minute"]), _label(minutes[-1]["minute"])
    return (f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT + 14}" role="img" '
            f'aria-label="{escape(title)}">'
            f'<title>{escape(title)}</title>'
            f'<line class="axis" x1="0" y1="{HEIGHT}" x2="{WIDTH}" y2="{HEIGHT}"/>'
            f'<text class="label" x="2" y="10">{top:,}</text>'
            f'<text class="label" x="2" y="{HEIGHT + 12}">{first}</text>'
            f'<text class="label" x="{WIDTH - 2}" y="{HEIGHT + 12}" '
            f'text-anchor="end">{last} UTC</text>')
