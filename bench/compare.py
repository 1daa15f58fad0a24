"""Side by side on one machine, one clock: celery_interval against the usual ways to space starts.

Run: python bench/compare.py [--quick] [--intervals 0.01,0.05] [--workers 3] [--seconds 6]
[--systems a,b] [--plot bench/compare.png] [--json].

Same workload for every system: W worker processes with 2 executors each (Celery prefork
``-c 2``; Dramatiq ``-p W -t 2``), a backlog of N = seconds / interval tasks enqueued up front,
one target interval. Every body records its start on CLOCK_MONOTONIC (one clock for every
process on this host) in a separate recorder Redis; the measured redis-server (broker and
store or limiter) is fresh for each run, so its INFO commandstats count only the system.
Systems: celery_interval (IntervalTask); celery_rate_limit (rate_limit = the global target);
celery_rate_limit_per_worker (rate_limit = target / W); diy_set_nx_retry (SET NX PX gate,
``self.retry(countdown=interval)``); dramatiq_bucket (Dramatiq's BucketRateLimiter on Redis,
retried by its Retries middleware; skipped with a message when dramatiq is not installed).
``--json`` prints one object ``{"results": [...], "skipped": [...]}`` and nothing else on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from harness import (
    Measured,
    machine_line,
    markdown_table,
    measured_server,
    ms,
    note,
    recorder_server,
    run_system,
)
from plot import plot_compare
from systems import COMPARED, build, dramatiq_missing

QUICK_SECONDS = 3.0


def run_all(
    systems: list[str], intervals: list[float], workers: int, seconds: float
) -> list[Measured]:
    runs = []
    with recorder_server() as recorder_url:
        for interval_s in intervals:
            tasks = max(20, math.ceil(seconds / interval_s))
            for name in systems:
                note(f"{name}: {tasks} tasks at {interval_s * 1e3:g} ms on {workers} workers")
                with measured_server(recorder_url) as servers:
                    run = run_system(
                        build(name, servers, interval_s, workers),
                        servers,
                        interval_s=interval_s,
                        tasks=tasks,
                        workers=workers,
                        timeout_s=60 + 10 * tasks * interval_s,
                    )
                note(f"  {json.dumps(run.row())}")
                runs.append(run)
    return runs


def table(rows: list[dict[str, Any]]) -> str:
    header = [
        "system", "interval", "completed", "dup", "missing", "utilization", "min gap",
        "violations", "p50 / p99 gap", "p99 lateness", "retries (re-tickets)",
        "Redis cmds/task (scripts)", "worker CPU ms/task",
    ]  # fmt: skip
    cells = [
        [
            r["system"],
            f"{r['interval_s'] * 1e3:g} ms",
            f"{r['completed']}/{r['tasks']}",
            str(r["duplicates"]),
            str(r["missing"]),
            "-" if r["utilization"] is None else f"{r['utilization']:.2f}",
            ms(r["min_gap_s"]) + " ms",
            f"{r['violations']} ({r['violations'] / max(1, r['completed'] - 1):.0%})",
            f"{ms(r['p50_gap_s'])} / {ms(r['p99_gap_s'])} ms",
            ms(r["p99_lateness_s"]) + (" ms" if r["p99_lateness_s"] is not None else ""),
            str(r["retries"]) + (f" ({r['retickets']})" if r["retickets"] is not None else ""),
            f"{r['redis_commands_per_task']:.1f} ({r['redis_script_calls_per_task']:.1f})",
            f"{r['worker_cpu_s_per_task'] * 1e3:.2f}",
        ]
        for r in rows
    ]
    return markdown_table(header, cells, "lrrrrrrrrrrrr")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--intervals", default="0.01,0.05", help="seconds, comma-separated")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, help="backlog length at the target rate")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SECONDS:g} s backlogs")
    parser.add_argument("--systems", default=",".join(COMPARED))
    parser.add_argument("--plot", help="write the raster and gap-CDF PNG here")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    seconds = args.seconds or (QUICK_SECONDS if args.quick else 6.0)
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(COMPARED))
    if unknown:
        parser.error(f"--systems: unknown {', '.join(unknown)}; known: {', '.join(COMPARED)}")
    skipped = []
    why = dramatiq_missing() if "dramatiq_bucket" in systems else None
    if why:
        note(f"dramatiq_bucket skipped: {why}")
        skipped.append({"system": "dramatiq_bucket", "reason": why})
        systems.remove("dramatiq_bucket")
    intervals = [float(x) for x in args.intervals.split(",")]
    note(machine_line())
    runs = run_all(systems, intervals, args.workers, seconds)
    if args.plot:
        plot_compare(runs, Path(args.plot))
        note(f"plot written to {args.plot}")
    rows = [r.row() for r in runs]
    if args.json:
        print(json.dumps({"results": rows, "skipped": skipped}))
        return
    print(f"{machine_line()}; {args.workers} workers x 2 executors, {seconds:g} s backlogs\n")
    print(table(rows))
    for r in rows:
        if r["claim_violations"] is not None:
            print(
                f"\n{r['system']} at {r['interval_s'] * 1e3:g} ms, claims in its ledger (store "
                f"clock): {r['claim_violations']} closer than the interval, min claim gap "
                f"{ms(r['claim_min_gap_s'], 3)} ms, {r['retickets']} re-tickets."
            )
    for s in skipped:
        print(f"\n{s['system']} skipped: {s['reason']}")


if __name__ == "__main__":
    main()
