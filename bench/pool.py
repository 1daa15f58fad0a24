"""A real pool (3 workers x prefork 2) at 5, 20 and 100 ms: spacing, lateness, store calls.

Run: python bench/pool.py [--intervals 0.005,0.02,0.1] [--seconds 6] [--worker-args=
"--max-tasks-per-child=1"]. Uses the demo's runner
(an embedded redis-server as broker and store, real `celery worker` processes, no pause) and
prints one Markdown table. Claims are read from the bucket's ledger (store clock); body
starts from this host's monotonic clock, which every worker here shares.
"""

from __future__ import annotations

import argparse
import math

from celery_interval.demo import DemoOptions, run_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--intervals", default="0.005,0.02,0.1")
    parser.add_argument("--seconds", type=float, default=6.0, help="backlog length per run")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--worker-args", default="", help="more celery worker options, space-separated"
    )
    args = parser.parse_args()
    print(
        "| interval | tasks | completed | dup | claim violations | min claim gap | "
        "body gaps < floor | utilization (claims / bodies) | lateness p50 / p99 | "
        "store calls/task |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for interval_s in (float(x) for x in args.intervals.split(",")):
        tasks = max(20, math.ceil(args.seconds / interval_s))
        options = DemoOptions(
            workers=args.workers,
            tasks=tasks,
            interval_s=interval_s,
            pause_s=0,
            as_json=True,
            worker_args=tuple(args.worker_args.split()),
        )
        with open("/dev/null", "w") as sink:
            _, f = run_demo(options, out=sink)
        print(
            f"| {interval_s * 1e3:g} ms | {f.tasks} | {f.completed} | {f.duplicates} | "
            f"{f.violations} | {f.min_gap_s * 1e3:.3f} ms | {f.body_below_floor} "
            f"({f.body_below_floor / max(1, f.tasks - 1):.1%}) | "
            f"{f.utilization:.3f} / {f.body_utilization:.3f} | "
            f"{f.p50_lateness_s * 1e3:.2f} / {f.p99_lateness_s * 1e3:.2f} ms | "
            f"{f.store_calls_per_task:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
