"""Side by side on one machine, one clock: celery_interval against Celery's own rate_limit.

Run: python bench/compare.py [--intervals 0.01,0.05] [--workers 3] [--seconds 4] [--json].
Same workload for each system: W real workers (prefork -c 2) on an embedded redis-server
(broker and store), a backlog of N tasks enqueued up front, one target interval. Every task
records its body start on this host's monotonic clock (shared by all workers here).
Systems: celery_interval (IntervalTask); celery_rate_limit (rate_limit = the global target);
celery_rate_limit_per_worker (rate_limit = target / W, what users try). Not yet here: the DIY
SET NX + retry pattern and Dramatiq's limiter.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from celery_interval.demo import DemoOptions, run_demo

SYSTEMS = ("celery_interval", "celery_rate_limit", "celery_rate_limit_per_worker")


def run(system: str, interval_s: float, workers: int, tasks: int) -> dict[str, Any]:
    """One system's run; violations are body-start gaps below 0.9 x interval."""
    per_s = 1 / interval_s
    task, rate_limit = {
        "celery_interval": ("demo.call_api", ""),
        "celery_rate_limit": ("demo.rate_limited", f"{per_s:g}/s"),
        "celery_rate_limit_per_worker": ("demo.rate_limited", f"{per_s / workers:g}/s"),
    }[system]
    options = DemoOptions(
        workers=workers,
        tasks=tasks,
        interval_s=interval_s,
        pause_s=0,
        as_json=True,
        task=task,
        rate_limit=rate_limit,
    )
    with open("/dev/null", "w") as sink:
        _, f = run_demo(options, out=sink)
    return {
        "system": system,
        "interval_s": interval_s,
        "rate_limit": rate_limit or None,
        "tasks": f.tasks,
        "completed": f.completed,
        "duplicates": f.duplicates,
        "missing": f.tasks - f.completed,
        "utilization": f.body_utilization,
        "min_gap_s": f.body_min_gap_s,
        "violations": f.body_gaps_below_90pct,
        "p1_gap_s": f.body_gap_p1_s,
        "p50_gap_s": f.body_gap_p50_s,
        "p99_gap_s": f.body_gap_p99_s,
        "p99_lateness_s": f.p99_lateness_s if system == "celery_interval" else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--intervals", default="0.01,0.05")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="backlog length at target")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args()
    results = []
    for interval_s in (float(x) for x in args.intervals.split(",")):
        tasks = max(20, math.ceil(args.seconds / interval_s))
        for system in SYSTEMS:
            results.append(run(system, interval_s, args.workers, tasks))
    if args.json:
        print(json.dumps({"results": results}))
        return
    print(
        "| system | interval | completed | dup | utilization | min gap | gaps < 0.9 x interval "
        "| p1 / p50 / p99 gap |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['system']} | {r['interval_s'] * 1e3:g} ms | {r['completed']}/{r['tasks']} | "
            f"{r['duplicates']} | {r['utilization']:.2f} | {r['min_gap_s'] * 1e3:.2f} ms | "
            f"{r['violations']} ({r['violations'] / max(1, r['tasks'] - 1):.0%}) | "
            f"{r['p1_gap_s'] * 1e3:.2f} / {r['p50_gap_s'] * 1e3:.2f} / "
            f"{r['p99_gap_s'] * 1e3:.2f} ms |"
        )


if __name__ == "__main__":
    main()
