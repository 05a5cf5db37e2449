"""Whether the worker's claim costs the same whatever else the table holds (a bench, not a test).

    PGTASKD_DSN=postgresql://postgres@127.0.0.1:5432/postgres \
        .venv/bin/python tests/bench_claim_flat.py [--claims 200] [--rounds 3] \
        [--cases a,b,c,d,e,f,g,h,i] [--finished 5000000] [--explain] [--keep]

Issue 14.7 and 15.9. Two scratch schemas of that database (the bench's own, dropped at the end
unless --keep): the baseline's, which holds only the work the claims take (20,000 due PENDING
tasks of type ``echo`` at priority 0), and the case's, which holds the same due tasks and,
one case at a time (emptied and filled again for each), the rows a claim must not read:

  a  1,000,000 future tasks at priority 10, above the due backlog
  b  5,000 future tasks, each at a priority level of its own
  c  300,000 future priority levels
  d  1,000,000 future priority levels
  e  50,000 RUNNING tasks under live leases, at priority 9
  f  200,000 due tasks of 20 other types, at priority 9
  g  5,000,000 COMPLETED tasks (--finished)
  h  200,000 due tasks of 20 other types, at priority 9, due an hour before the worker's
  i  case e and 10 due tasks at priority 5, newer than the backlog (claimed first)

"Future" is a day ahead, so no row comes within the staging lead while the bench runs. Each
fill is set-based (INSERT ... SELECT generate_series) and followed by VACUUM ANALYZE, so the
generic plan is made against the statistics of the skew.

The claim is timed as the worker runs it: ``store.claim_tasks`` on a connection set up by
``use_generic_plans`` (a generic plan, prepared once psycopg has seen the statement five
times, JIT off), after 20 claims of warm-up. Each claim runs in a transaction that is rolled
back, so every claim finds the table as it was set up (the same due rows, none consumed);
what is timed is the claim's call, not the rollback (nor the commit a worker's claim pays,
which costs the same whatever the table holds). The staging the worker runs beside its
claims (``stage_tasks``, every quarter second while claims come back full) is kept out of
the claim's time by marking the connection as just staged before each claim, and timed on
its own: the same number of calls, each committed as the worker's are.

Each round times ``--claims`` claims of one and of ten, and the staging calls, the baseline's
and the case's taking turns call by call, so that the ratio compares figures taken under the
same load on a machine whose load changes. Per case and round it prints median and p95 in ms
and the ratio of the medians to the baseline's; at the end, for each case, the median over
the rounds.
``--explain`` prints, once per case, EXPLAIN (ANALYZE, BUFFERS) of the generic plan of a
claim of one.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

import psycopg.sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.cli.bench_database import scratch_schema  # noqa: E402
from supervisor.db import store  # noqa: E402
from supervisor.db.connect import connect  # noqa: E402
from supervisor.db.queries import QUERIES  # noqa: E402
from supervisor.worker.pools import use_generic_plans  # noqa: E402

DUE = 20_000
WARM_UP = 20
DAY_AHEAD = "now() + interval '1 day'"

# Each case: its label, then the INSERTs of the rows the claim must not read. Future rows are
# written unstaged, as a client's submit leaves them (the trigger agrees and does nothing).
CASES = {
    "a": ("1M future rows at priority 10 over the due rows",
          ["INSERT INTO tasks (id, name, task_type, priority, scheduled_time, staged) "
           f"SELECT 'ahead' || g, 'n', 'echo', 10, {DAY_AHEAD} + g * interval '1 ms', false "
           "FROM generate_series(1, 1000000) g"]),
    "b": ("5,000 future priority levels",
          ["INSERT INTO tasks (id, name, task_type, priority, scheduled_time, staged) "
           f"SELECT 'level' || g, 'n', 'echo', 100 + g, {DAY_AHEAD}, false "
           "FROM generate_series(1, 5000) g"]),
    "c": ("300,000 future priority levels",
          ["INSERT INTO tasks (id, name, task_type, priority, scheduled_time, staged) "
           f"SELECT 'level' || g, 'n', 'echo', 100 + g, {DAY_AHEAD}, false "
           "FROM generate_series(1, 300000) g"]),
    "d": ("1M future priority levels",
          ["INSERT INTO tasks (id, name, task_type, priority, scheduled_time, staged) "
           f"SELECT 'level' || g, 'n', 'echo', 100 + g, {DAY_AHEAD}, false "
           "FROM generate_series(1, 1000000) g"]),
    "e": ("50,000 RUNNING rows, live leases",
          ["INSERT INTO tasks (id, name, task_type, priority, status, claimed_by, lease_until, "
           "lease_token) SELECT 'running' || g, 'n', 'echo', 9, 'RUNNING', 'w', "
           "now() + interval '1 day', g FROM generate_series(1, 50000) g"]),
    "f": ("200,000 due rows of other types",
          ["INSERT INTO tasks (id, name, task_type, priority) "
           "SELECT 'other' || g, 'n', 'other' || (g % 20), 9 "
           "FROM generate_series(1, 200000) g"]),
    "g": ("{finished:,} COMPLETED rows", []),
    # Not in the issue: case f with the other types' backlog older than the worker's, which
    # is what a plan reading all due rows in time order would walk.
    "h": ("200,000 older due rows of other types",
          ["INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
           "SELECT 'other' || g, 'n', 'other' || (g % 20), 9, "
           "now() - interval '1 hour' - g * interval '1 ms' "
           "FROM generate_series(1, 200000) g"]),
    # Not in the issue: a few due tasks at a higher priority than the backlog, newer than
    # it, with the statistics of case e (which made the generic plan read the level's rows
    # through the due-time index, in time order, the backlog's first).
    "i": ("10 due at priority 5 + 50,000 RUNNING rows",
          ["INSERT INTO tasks (id, name, task_type, priority, status, claimed_by, lease_until, "
           "lease_token) SELECT 'running' || g, 'n', 'echo', 9, 'RUNNING', 'w', "
           "now() + interval '1 day', g FROM generate_series(1, 50000) g",
           "INSERT INTO tasks (id, name, task_type, priority) "
           "SELECT 'due-p5-' || g, 'n', 'echo', 5 FROM generate_series(1, 10) g"]),
}


def finished_inserts(count: int, chunk: int = 1_000_000) -> list[str]:
    """In chunks of a million, so that one statement does not hold the WAL of all of them."""
    return ["INSERT INTO tasks (id, name, task_type, status, finished_at) "
            "SELECT 'done' || g, 'n', 'echo', 'COMPLETED', now() "
            f"FROM generate_series({start}, {min(start + chunk - 1, count)}) g"
            for start in range(1, count + 1, chunk)]


def fill(dsn: str, inserts: list[str]) -> float:
    """Empty the schema's tasks, write the due backlog and ``inserts``; seconds taken."""
    started = time.monotonic()
    with connect(dsn, connect_timeout=10) as conn:
        conn.execute("TRUNCATE tasks, task_attempts")
        conn.execute("INSERT INTO tasks (id, name, task_type, priority, scheduled_time) "
                     "SELECT 'due' || g, 'n', 'echo', 0, now() - g * interval '1 ms' "
                     "FROM generate_series(1, %s) g", (DUE,))
        for insert in inserts:
            conn.execute(insert)
        conn.execute("VACUUM ANALYZE tasks")
    return time.monotonic() - started


def worker_connection(dsn: str):
    conn = connect(dsn, connect_timeout=10, application_name="pgtaskd bench claim")
    use_generic_plans(conn)
    return conn


def claim_once(conn, limit: int) -> float:
    # Marked as just staged: store.claim_tasks would otherwise run stage_tasks inside this
    # call every quarter second; it is timed on its own.
    store._STAGED_AT[conn] = time.monotonic()
    with conn.transaction(force_rollback=True):
        started = time.monotonic()
        rows = store.claim_tasks(conn, worker_id="bench", task_types=["echo"],
                                 lease_seconds=30, limit=limit)
        elapsed = time.monotonic() - started
    if len(rows) != limit or any(not row["id"].startswith("due") for row in rows):
        raise SystemExit(f"a claim of {limit} took {[row['id'] for row in rows]}, "
                         f"not {limit} of the due tasks")
    return 1000 * elapsed


def stage_once(conn) -> float:
    started = time.monotonic()
    staged = store.stage_tasks(conn, ["echo"])["staged"]
    elapsed = time.monotonic() - started
    if staged:
        raise SystemExit(f"stage_tasks staged {staged} rows: the fill is not what it says")
    return 1000 * elapsed


def measure(base, case, claims: int) -> tuple[dict, dict]:
    """ms of each call on the baseline's connection and on the case's: claims of one,
    claims of ten, stage_tasks. The two take turns call by call (one first, then the other
    first), so that both see the same load of a shared machine."""
    calls = {"claim 1": lambda conn: claim_once(conn, 1),
             "claim 10": lambda conn: claim_once(conn, 10), "stage": stage_once}
    for _ in range(WARM_UP):
        for call in calls.values():
            call(base), call(case)
    times = ({kind: [] for kind in calls}, {kind: [] for kind in calls})
    for kind, call in calls.items():
        for n in range(claims):
            order = (0, 1) if n % 2 == 0 else (1, 0)
            for side in order:
                times[side][kind].append(call((base, case)[side]))
    return times


def p95(times: list[float]) -> float:
    return statistics.quantiles(times, n=20)[-1]


def explain(conn) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the generic plan of the worker's claim of one (the
    statement use_generic_plans leaves it), in a transaction rolled back."""
    names: list[str] = []

    def placeholder(match):
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    params = {"worker_id": "bench", "done_ids": [], "done_tokens": [], "done_cpu": [],
              "done_rss": [], "task_types": ["echo"], "lease_seconds": 30, "limit": 1}
    text = re.sub(r"%\((\w+)\)s", placeholder, QUERIES["complete_and_claim"]).replace("%%", "%")
    conn.execute("PREPARE bench_claim AS " + text)
    arguments = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(params[n]) for n in names)
    lines = []
    for _ in range(2):  # the first also reads the catalog
        with conn.transaction(force_rollback=True):
            lines = [row[0] for row in conn.execute(psycopg.sql.SQL(
                "EXPLAIN (ANALYZE, BUFFERS) EXECUTE bench_claim ({})").format(arguments))]
    conn.execute("DEALLOCATE bench_claim")
    return "\n".join(lines)


KINDS = ("claim 1", "claim 10", "stage")


def report_round(label: str, number: int, base: dict, case: dict) -> dict[str, float]:
    ratios = {}
    print(f"  round {number}:")
    for kind in KINDS:
        b, c = statistics.median(base[kind]), statistics.median(case[kind])
        ratios[kind] = c / b
        print(f"    {kind:8}  baseline median {b:6.2f} p95 {p95(base[kind]):6.2f} | "
              f"{label} median {c:6.2f} p95 {p95(case[kind]):6.2f} | ratio {c / b:5.2f}")
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=200, help="timed calls of each kind")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--finished", type=int, default=5_000_000, help="rows of case g")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"--cases: no case {', '.join(unknown)} (known: {', '.join(CASES)})")
    for name, value, least in [("--claims", args.claims, 2), ("--rounds", args.rounds, 1),
                               ("--finished", args.finished, 0)]:
        if value < least:
            parser.error(f"{name}: {value} is less than {least}")
    dsn = os.environ.get("PGTASKD_DSN")
    if not dsn:
        parser.error("PGTASKD_DSN is not set: the database to make the scratch schemas in")
    summary = []
    with scratch_schema(dsn, keep=args.keep) as base_dsn, \
            scratch_schema(dsn, keep=args.keep) as case_dsn:
        print(f"baseline: {DUE:,} due tasks only, filled in {fill(base_dsn, []):.1f} s")
        base = worker_connection(base_dsn)
        if args.explain:
            print(explain(base))
        for key in cases:
            label, inserts = CASES[key]
            if key == "g":
                label, inserts = label.format(finished=args.finished), \
                    finished_inserts(args.finished)
            seconds = fill(case_dsn, inserts)
            print(f"case {key}: {label} (+ the {DUE:,} due), filled in {seconds:.1f} s")
            with worker_connection(case_dsn) as conn:
                if args.explain:
                    print(explain(conn))
                rounds = [report_round(key, n + 1, *measure(base, conn, args.claims))
                          for n in range(args.rounds)]
            summary.append((key, label, {k: statistics.median(r[k] for r in rounds)
                                         for k in KINDS}))
        base.close()
    print(f"\nmedian over {args.rounds} rounds of the ratio of medians to the baseline "
          f"({args.claims} calls each):")
    print(f"  {'case':44} " + " ".join(f"{kind:>8}" for kind in KINDS))
    for key, label, ratios in summary:
        print(f"  {key} {label:42} " + " ".join(f"{ratios[k]:8.2f}" for k in KINDS))


if __name__ == "__main__":
    main()
