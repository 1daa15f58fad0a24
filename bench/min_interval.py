"""The smallest interval this machine sustains: 0 violations and utilization >= 0.95.

Run: python bench/min_interval.py [--candidates 0.05,0.02,0.01,0.005,0.003,0.002,0.001]
[--seconds 3] [--workers 3] [--json].
Each candidate is the compare workload for celery_interval alone (W workers x prefork 2, a
backlog of max(200, seconds / interval) tasks up front, body starts on CLOCK_MONOTONIC). A
candidate passes with every task started exactly once, no body-start gap below 0.9 x interval
and utilization (achieved / target rate) >= 0.95. Also shown: body gaps below the OS floor
(interval - max(10 %, 3 ms), as in ``celery_interval.demo.report``) and the claims in the bucket's
ledger (store clock), which no OS wake-up delay touches. Every candidate runs, longest first (on a
shared machine pass and fail need not be monotone in the interval).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from harness import (
    machine_line,
    markdown_table,
    measured_server,
    ms,
    note,
    recorder_server,
    run_system,
)
from systems import build

MIN_UTILIZATION = 0.95


def passes(row: dict[str, Any]) -> bool:
    return bool(
        row["completed"] == row["tasks"]
        and row["duplicates"] == 0
        and row["violations"] == 0
        and (row["utilization"] or 0) >= MIN_UTILIZATION
    )


def search(candidates: list[float], seconds: float, workers: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with recorder_server() as recorder_url:
        for interval_s in sorted(candidates, reverse=True):
            tasks = max(200, math.ceil(seconds / interval_s))
            note(f"celery_interval: {tasks} tasks at {interval_s * 1e3:g} ms")
            with measured_server(recorder_url) as servers:
                run = run_system(
                    build("celery_interval", servers, interval_s, workers),
                    servers,
                    interval_s=interval_s,
                    tasks=tasks,
                    workers=workers,
                    timeout_s=60 + 10 * tasks * interval_s,
                )
            row = {**run.row(), "passes": passes(run.row())}
            note(f"  {json.dumps(row)}")
            rows.append(row)
    passing = [r["interval_s"] for r in rows if r["passes"]]
    return {"results": rows, "smallest_sustained_s": min(passing) if passing else None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--candidates", default="0.05,0.02,0.01,0.005,0.003,0.002,0.001")
    parser.add_argument("--seconds", type=float, default=3.0, help="backlog length at target")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    note(machine_line())
    result = search([float(x) for x in args.candidates.split(",")], args.seconds, args.workers)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{machine_line()}; {args.workers} workers x prefork 2\n")
    header = ["interval", "completed", "dup", "utilization", "violations", "min gap",
              "p50 / p99 gap", "p99 lateness", "re-tickets", "gaps < floor", "claims: violations",
              "claims: utilization", "worker CPU ms/task", "sustained"]  # fmt: skip
    rows = [
        [
            f"{r['interval_s'] * 1e3:g} ms",
            f"{r['completed']}/{r['tasks']}",
            str(r["duplicates"]),
            "-" if r["utilization"] is None else f"{r['utilization']:.3f}",
            str(r["violations"]),
            f"{ms(r['min_gap_s'], 3)} ms",
            f"{ms(r['p50_gap_s'], 3)} / {ms(r['p99_gap_s'], 3)} ms",
            f"{ms(r['p99_lateness_s'])} ms",
            str(r["retickets"]),
            str(r["body_below_floor"]),
            str(r["claim_violations"]),
            "-" if r["claim_utilization"] is None else f"{r['claim_utilization']:.3f}",
            f"{r['worker_cpu_s_per_task'] * 1e3:.2f}",
            "yes" if r["passes"] else "no",
        ]
        for r in result["results"]
    ]
    print(markdown_table(header, rows, "rrrrrrrrrrrrrl"))
    smallest = result["smallest_sustained_s"]
    print(
        "\nsmallest sustained interval: "
        + ("none of the candidates" if smallest is None else f"{smallest * 1e3:g} ms")
    )


if __name__ == "__main__":
    main()
