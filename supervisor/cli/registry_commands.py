"""``pgtaskd daemons``: the daemon registry, one block per daemon with its children and the
tasks each runs."""

from __future__ import annotations

from ..client import Client
from ..config import Config
from ..errors import EXIT_OK
from .operator_input import arguments_named
from .output import human_time, print_json, printable, render_table


def cmd_daemons(args, config: Config) -> int:
    with Client.from_config(config) as client, arguments_named():
        daemons = client.daemons(state=args.state, limit=args.limit)
    if args.json:
        print_json(daemons)
    elif not daemons:
        print("(no daemons)" if args.state is None else f"(no {args.state.lower()} daemons)")
    else:
        print("\n\n".join(daemon_block(d) for d in daemons))
    return EXIT_OK


def daemon_block(daemon: dict) -> str:
    """A daemon's header, its times, and a table of its children."""
    state = daemon["state"]
    last = "signed off" if state == "stopped" else "last heartbeat"
    if state == "lost":
        state = f"LOST (silent {elapsed(daemon['silent_seconds'])}, " \
                f"last said {daemon['reported_state']})"
    lines = [f"{printable(daemon['daemon'])}  pid {daemon['pid']}  {state}  "
             f"generation {daemon['generation']}  pgtaskd {printable(daemon['version'])}",
             f"  started {human_time(daemon['started_at'])}, {last} "
             f"{elapsed(daemon['silent_seconds'])} ago (every "
             f"{daemon['heartbeat_interval']:g} s), id {daemon['id']}"]
    rows = [[pool, str(child.get("slot")), str(child.get("pid")), str(child.get("generation")),
             str(child.get("state")), child_tasks(child)]
            for pool, children in sorted(daemon["pools"].items()) for child in children]
    if rows:
        table = render_table(["POOL", "SLOT", "PID", "GEN", "STATE", "TASKS"], rows,
                             right_aligned={"SLOT", "PID", "GEN"})
        lines += ["  " + line for line in table.splitlines()]
    return "\n".join(lines)


def child_tasks(child: dict) -> str:
    """The tasks a child runs (``type id``), then how many more claims it holds."""
    tasks = child.get("tasks") or []
    running = [f"{t['type']} {t['id']}" for t in tasks if t.get("state") == "running"]
    others = (child.get("held") or len(tasks)) - len(running)
    if others:
        running.append(f"+{others} held" if running else f"{others} held")
    return ", ".join(running) or "-"


def elapsed(seconds: float) -> str:
    """A duration for people: 1.2 s, 4 min, 3 h 5 min, 2 d 4 h."""
    if seconds < 60:
        return f"{max(seconds, 0.0):.1f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
