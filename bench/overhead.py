"""Per-task CPU of IntervalTask against a plain Celery task on the same pool, at saturation.

Run: python bench/overhead.py [--tasks 1000] [--rounds 2] [--workers 3] [--json].
Both run the same body on W workers x prefork 2 with a backlog of N tasks enqueued up front;
IntervalTask's bucket has a 1 µs interval (the smallest accepted), so the pool, not the
interval, limits the rate and every task pays the full grant + claim + done path. The plain
task's workers run Celery without celery_interval. Rounds alternate plain / interval so drift
in the machine's load hits both; the ratio is taken of the medians. CPU is per started task
(a run that misses its timeout reports how many started). Target: <= 1.3x.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from harness import (
    Measured,
    machine_line,
    markdown_table,
    measured_server,
    note,
    recorder_server,
    run_system,
)
from systems import build

INTERVAL_S = 1e-6
SYSTEMS = ("celery_plain", "celery_interval")
TARGET_RATIO = 1.3


def throughput_per_s(run: Measured) -> float:
    starts = run.start_times_s()
    return (len(starts) - 1) / (starts[-1] - starts[0]) if len(starts) > 1 else float("nan")


def measure(tasks: int, rounds: int, workers: int, timeout_s: float) -> dict[str, Any]:
    per_system: dict[str, list[dict[str, float]]] = {s: [] for s in SYSTEMS}
    commands: dict[str, dict[str, float]] = {}
    with recorder_server() as recorder_url:
        for n in range(rounds):
            for name in SYSTEMS:
                note(f"round {n + 1}/{rounds}: {name}, {tasks} tasks")
                with measured_server(recorder_url) as servers:
                    run = run_system(
                        build(name, servers, INTERVAL_S, workers),
                        servers,
                        interval_s=INTERVAL_S,
                        tasks=tasks,
                        workers=workers,
                        timeout_s=timeout_s,
                    )
                row = run.row()
                per_system[name].append(
                    {
                        "completed": row["completed"],
                        "duplicates": row["duplicates"],
                        "worker_cpu_ms_per_task": row["worker_cpu_s_per_task"] * 1e3,
                        "main_cpu_ms_per_task": row["main_cpu_s_per_task"] * 1e3,
                        "redis_cpu_ms_per_task": row["redis_cpu_s_per_task"] * 1e3,
                        "redis_commands_per_task": row["redis_commands_per_task"],
                        "tasks_per_s": throughput_per_s(run),
                        "retickets_per_task": (row["retickets"] or 0) / max(1, row["completed"]),
                    }
                )
                commands[name] = run.commands_per_task()  # the last round's
                note(f"  {json.dumps(per_system[name][-1])}")
    medians = {
        name: {k: statistics.median(float(r[k]) for r in runs) for k in runs[0]}
        for name, runs in per_system.items()
    }
    plain, interval = medians["celery_plain"], medians["celery_interval"]
    return {
        "tasks": tasks,
        "rounds": rounds,
        "workers": workers,
        "interval_s": INTERVAL_S,
        "runs": per_system,
        "commands_per_task_last_round": commands,
        "median": medians,
        "worker_cpu_ratio": interval["worker_cpu_ms_per_task"] / plain["worker_cpu_ms_per_task"],
        "worker_plus_redis_cpu_ratio": (
            (interval["worker_cpu_ms_per_task"] + interval["redis_cpu_ms_per_task"])
            / (plain["worker_cpu_ms_per_task"] + plain["redis_cpu_ms_per_task"])
        ),
        "throughput_ratio": interval["tasks_per_s"] / plain["tasks_per_s"],
        "target_ratio": TARGET_RATIO,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run")
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    note(machine_line())
    result = measure(args.tasks, args.rounds, args.workers, args.timeout)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{machine_line()}; {args.workers} workers x prefork 2, {args.tasks} tasks, "
        f"medians of {args.rounds} rounds\n"
    )
    rows = [
        [
            name,
            f"{m['completed']:.0f}/{args.tasks}",
            f"{m['worker_cpu_ms_per_task']:.2f}",
            f"{m['main_cpu_ms_per_task']:.2f}",
            f"{m['redis_cpu_ms_per_task']:.3f}",
            f"{m['redis_commands_per_task']:.1f}",
            f"{m['tasks_per_s']:.0f}",
            f"{m['retickets_per_task']:.2f}",
        ]
        for name, m in result["median"].items()
    ]
    header = ["task", "started (median)", "worker CPU ms/task", "of which worker mains",
              "redis CPU ms/task", "Redis cmds/task", "tasks/s", "re-tickets/task"]  # fmt: skip
    print(markdown_table(header, rows, "lrrrrrrr"))
    for name, by_command in result["commands_per_task_last_round"].items():
        shown = ", ".join(f"{c} {n:.2f}" for c, n in by_command.items() if n >= 0.05)
        print(f"\n{name}, Redis commands per task (last round): {shown}")
    verdict = "meets" if result["worker_cpu_ratio"] <= TARGET_RATIO else "MISSES"
    print(
        f"\nworker CPU per task, IntervalTask / plain: {result['worker_cpu_ratio']:.2f}x "
        f"({verdict} the {TARGET_RATIO}x target); worker + redis-server: "
        f"{result['worker_plus_redis_cpu_ratio']:.2f}x; throughput: "
        f"{result['throughput_ratio']:.2f}x"
    )


if __name__ == "__main__":
    main()
