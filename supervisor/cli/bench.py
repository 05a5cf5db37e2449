"""``pgtaskd bench``: the yardstick for throughput, pickup latency and memory.

Every run happens in a schema of its own on the configured database (through
``search_path``), created, migrated and dropped by the run, so it never touches the
operator's tasks. Each run measures, in order:

  submit       ``Client.submit`` one task per call, on one connection
  submit_many  ``Client.submit_many`` of all the tasks at once
  ceiling      the worker's own claim-and-complete statement driven by the same number of
               processes and batch size, with no daemon around it: what the database allows
  drain        a real daemon (``pgtaskd run``) with one pool of no-op workers: the time from
               the start of one ``submit_many`` to the last task COMPLETED
  latency      with the daemon's workers idle, one task submitted at a random moment, and the
               time until its handler starts (reported back over UDP on 127.0.0.1)

It also reads the daemon's memory (RSS) once it has booted and after the drain, and the CPU
time each kind of process spent per drained task. Machines are shared and noisy: every run
is printed and the median is what counts.

This module runs them and reports; the measurements are in ``bench_database`` (no daemon:
submit, submit_many, the ceiling) and ``bench_daemon`` (the drain, latency, memory and CPU).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ..config import Config
from ..db import store
from ..db.connect import connect, describe_target
from ..db.session import database_dsn
from .bench_daemon import BenchDaemon, daemon_memory, measure_drain, measure_latency
from .bench_database import (Options, ceiling_worker, measure_ceiling, measure_submit,
                             measure_submit_many, scratch_schema)


def run_once(dsn: str, options: Options, workdir: Path, progress) -> dict:
    with scratch_schema(dsn) as bench_dsn:
        if options.limit:
            # Set before the ceiling, so that the bare SQL pays for the slots as the daemon
            # does.
            with connect(bench_dsn) as conn:
                store.set_task_type_limit(conn, "noop", options.limit, updated_by="bench")
        result = {"submit_per_second": measure_submit(bench_dsn, min(options.tasks, 5000),
                                                      progress),
                  "submit_many_per_second": measure_submit_many(bench_dsn, options.tasks,
                                                                progress),
                  "ceiling_per_second": measure_ceiling(bench_dsn, options, progress)}
        with BenchDaemon(bench_dsn, options, workdir) as daemon, connect(bench_dsn) as conn:
            progress("booting the daemon")
            daemon.wait_booted(conn)
            result["memory_idle"] = daemon_memory(daemon)
            drain = measure_drain(daemon, conn, options, progress)
            result["drain_per_second"] = drain["tasks_per_second"]
            result["cpu_us_per_task"] = drain["cpu_us_per_task"]
            result["memory_after_drain"] = daemon_memory(daemon)
            result["concurrency"] = options.concurrency
            if options.latency_samples:
                time.sleep(0.5)  # idle again: every worker waits for a wake-up
                result["latency"] = measure_latency(daemon, conn, options.latency_samples,
                                                    progress)
            result["memory_after"] = daemon_memory(daemon)
    return result


# -- the report -------------------------------------------------------------------------------

def summarize(runs: list[dict]) -> dict:
    def median(key):
        return statistics.median(run[key] for run in runs)

    summary = {key: median(key) for key in
               ("submit_per_second", "submit_many_per_second", "ceiling_per_second",
                "drain_per_second")}
    summary["drain_percent_of_ceiling"] = 100 * summary["drain_per_second"] / \
        summary["ceiling_per_second"]
    if all("latency" in run for run in runs):
        summary["latency"] = {key: statistics.median(run["latency"][key] for run in runs)
                              for key in ("p50_ms", "p95_ms", "p99_ms")}
    memories = [run[key] for run in runs for key in ("memory_idle", "memory_after")]
    summary["memory_max_mib"] = {
        key: max((m[key] for m in memories if m[key] is not None), default=None)
        for key in ("supervisor_mib", "worker_max_mib")}
    growth = [(run["memory_after_drain"]["worker_max_mib"] or 0)
              - (run["memory_idle"]["worker_max_mib"] or 0) for run in runs]
    if all("memory_after_drain" in run for run in runs) and runs[0].get("concurrency", 1) > 1:
        summary["worker_mib_per_concurrent_task"] = \
            max(statistics.median(growth), 0.0) / runs[0]["concurrency"]
    kinds = {kind for run in runs for kind in run["cpu_us_per_task"]}
    summary["cpu_us_per_task"] = {
        kind: statistics.median(run["cpu_us_per_task"].get(kind, 0) for run in runs)
        for kind in sorted(kinds)}
    return summary


def render(options: Options, target: str, runs: list[dict], summary: dict) -> str:
    def rates(key):
        return "  ".join(f"{run[key]:>8,.0f}" for run in runs)

    ceiling = summary["ceiling_per_second"]
    handler = ("async" if options.async_handler else "plain") + \
        (f" handlers waiting {options.work_ms:g} ms" if options.work_ms else " no-op handlers")
    lines = [f"pgtaskd bench: {options.tasks:,} tasks, {options.processes} processes, "
             f"batch size {options.batch_size}, concurrency {options.concurrency}, {handler}, "
             f"{options.runs} runs, on {target}"
             + (f", limited to {options.limit} at once" if options.limit else ""),
             "",
             f"{'measurement':<34}{'median':>12}  {'% of ceiling':>12}   runs"]
    for label, key, pct in (("submit, one per call", "submit_per_second", False),
                            ("submit_many", "submit_many_per_second", False),
                            ("ceiling: claim+complete SQL", "ceiling_per_second", True),
                            ("drain, real daemon", "drain_per_second", True)):
        share = f"{100 * summary[key] / ceiling:>11.0f}%" if pct else " " * 12
        lines.append(f"{label:<34}{summary[key]:>10,.0f}/s  {share}   {rates(key)}")
    if "latency" in summary:
        latency = summary["latency"]
        per_run = "  ".join(f"{r['latency']['p50_ms']:.2f}/{r['latency']['p95_ms']:.2f}/"
                            f"{r['latency']['p99_ms']:.2f}" for r in runs)
        lines.append(f"{'pickup latency p50/p95/p99 (ms)':<34}"
                     f"{latency['p50_ms']:>5.2f}/{latency['p95_ms']:.2f}/{latency['p99_ms']:.2f}"
                     f"{'':>12}   {per_run}  ({runs[0]['latency']['samples']} samples a run)")
    memory = summary["memory_max_mib"]
    lines.append(f"{'memory, largest RSS (MiB)':<34}supervisor {memory['supervisor_mib'] or 0:.1f}, "
                 f"worker {memory['worker_max_mib'] or 0:.1f} (at idle and after the runs)")
    if "worker_mib_per_concurrent_task" in summary:
        lines.append(f"{'worker RSS per concurrent task':<34}"
                     f"{summary['worker_mib_per_concurrent_task'] * 1024:,.0f} KiB (growth from "
                     f"idle to after the drain, over {options.concurrency} tasks at once)")
    cpu = ", ".join(f"{kind} {value:,.0f}" for kind, value in summary["cpu_us_per_task"].items())
    lines.append(f"{'CPU per drained task (us)':<34}{cpu}")
    return "\n".join(lines)


def run_bench(config: Config, options: Options) -> int:
    interactive = sys.stderr.isatty()
    runs: list[dict] = []
    last_phase = [""]

    def progress(text: str) -> None:
        """One line on a terminal, rewritten in place; elsewhere a line per phase."""
        line = f"run {len(runs) + 1}/{options.runs}: {text}"
        if interactive:
            sys.stderr.write(f"\r\033[K{line}")
            sys.stderr.flush()
        elif text.split()[0] != last_phase[0]:
            last_phase[0] = text.split()[0]
            print(line, file=sys.stderr, flush=True)

    with database_dsn(config) as dsn, tempfile.TemporaryDirectory(prefix="pgtaskd-bench-") as tmp:
        target = describe_target(dsn)
        for _ in range(options.runs):
            runs.append(run_once(dsn, options, Path(tmp), progress))
    if interactive:
        sys.stderr.write("\r\033[K")
    summary = summarize(runs)
    if options.as_json:
        print(json.dumps({"options": options.__dict__, "database": target, "runs": runs,
                          "median": summary}, indent=2))
    else:
        print(render(options, target, runs, summary))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["ceiling"]:
        sys.exit(ceiling_worker(int(sys.argv[2])))
    sys.exit(f"usage: {sys.argv[0]} ceiling BATCH_SIZE (started by pgtaskd bench)")
