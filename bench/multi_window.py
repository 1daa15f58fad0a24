"""Two limits of one bucket at once, on real workers: the interval "10/s" and "100/min".

Run: python bench/multi_window.py [--minutes 3] [--workers 2] [--limit-burst 1] [--json].
W workers x prefork 2 consume one queue whose interval is 0.1 s (10/s) with the extra limit
``limits: [("100/min", B)]`` in its declaration; a backlog of enough tasks for the run is sent
up front. Reported for the starts the store admitted (the ledger, the store's clock) and for the
body starts (CLOCK_MONOTONIC): the most starts in any half-open 1-s and 60-s window against 10
and 100 (with burst B the 60-s bound is 100 + B - 1), the smallest gap, and the achieved rate
against 100/min. Before the backlog is sent the store's birth marker is set and the bench waits
until the limit's whole budget is back (a new store counts every burst as used at its birth).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
import time
from typing import Any

from harness import (
    ProcessGroups,
    machine_line,
    measured_server,
    note,
    recorder_server,
    store_now_us,
    wait_ready,
    wait_started,
)
from recording import QUEUE, STARTS_KEY
from systems import build

from celery_interval.config.table import KEY_PREFIX
from celery_interval.schedule import Pace
from celery_interval.starts import is_start
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.keys import ledger_key
from celery_interval.stores.redis import RedisStore

INTERVAL_S = 0.1  # "10/s"
PER_MIN = 100


def most_in_window(times_s: list[float], window_s: float) -> int:
    """The most of ``times_s`` (sorted) in any half-open window ``[t, t + window_s)``."""
    return max(
        (bisect.bisect_left(times_s, t + window_s) - i for i, t in enumerate(times_s)), default=0
    )


def figures(times_s: list[float]) -> dict[str, Any]:
    """The window counts, smallest gap and rate of sorted start times (seconds)."""
    span_s = times_s[-1] - times_s[0]
    gaps_s = [b - a for a, b in itertools.pairwise(times_s)]
    counts_60 = [
        bisect.bisect_left(times_s, t + 60) - i
        for i, t in enumerate(times_s)
        if t + 60 <= times_s[-1]
    ]
    return {
        "starts": len(times_s),
        "span_s": round(span_s, 3),
        "most_in_1s": most_in_window(times_s, 1.0),
        "most_in_60s": most_in_window(times_s, 60.0),
        "fewest_in_full_60s": min(counts_60, default=None),
        "min_gap_s": round(min(gaps_s), 4),
        "rate_per_min": round((len(times_s) - 1) / span_s * 60, 2),
    }


def run(minutes: float, workers: int, limit_burst: int) -> dict[str, Any]:
    tasks = math.ceil(minutes * PER_MIN) + limit_burst
    conf = {"interval_queues": {QUEUE: {"limits": [["100/min", limit_burst]]}}}
    with recorder_server() as recorder_url, measured_server(recorder_url) as servers:
        system = build("celery_interval", servers, INTERVAL_S, workers, json.dumps(conf))
        client, recorder = servers.measured_client(), servers.recorder
        groups = ProcessGroups()
        try:
            groups.start(system.commands, system.env)
            wait_ready(groups, recorder, system.ready_count, timeout_s=90)
            # A new store counts every burst as used at its birth: set the birth marker (a grant
            # of another bucket), then wait until the limit's whole budget is back.
            store = RedisStore(client)
            store.grant(TaskCopy("warm-up", "t", 0), Pace(round(INTERVAL_S * 1e6)))
            time.sleep(limit_burst * 60 / PER_MIN + 0.5)
            since_us = store_now_us(client)
            began = time.monotonic()
            system.enqueue(servers, tasks)
            note(f"{tasks} tasks sent; about {tasks / PER_MIN:.1f} min to run")
            wait_started(recorder, tasks, deadline=began + minutes * 60 * 1.5 + 120)
            time.sleep(2.0)  # a late duplicate would still show up
            raw = recorder.lrange(STARTS_KEY, 0, -1)
            ledger: Any = client.xrange(ledger_key(KEY_PREFIX, QUEUE))
        finally:
            groups.stop()
        groups.remove_logs()
    records = [json.loads(r) for r in raw]
    admitted: dict[str, float] = {}
    claims_named = set()
    for _id, raw_fields in ledger:
        fields = {k.decode(): v.decode() for k, v in raw_fields.items()}
        if fields.get("op", "").startswith("claim:"):
            claims_named.add(fields.get("limits"))
        if is_start(fields) and int(fields["start"]) >= since_us:
            admitted[fields["task"]] = int(fields["start"]) / 1e6  # a readmit replaces its start
    body_s = sorted(r["mono_ns"] / 1e9 for r in records)
    return {
        "tasks": tasks,
        "completed": len({r["id"] for r in records}),
        "duplicates": len(records) - len({r["id"] for r in records}),
        "limit_burst": limit_burst,
        "bound_1s": round(1 / INTERVAL_S),
        "bound_60s": PER_MIN + limit_burst - 1,
        "ledger_limits": sorted(str(x) for x in claims_named),
        "store": figures(sorted(admitted.values())),
        "body": figures(body_s),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit-burst", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object only")
    args = parser.parse_args(argv)
    note(machine_line())
    result = run(args.minutes, args.workers, args.limit_burst)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{machine_line()}; {args.workers} workers x prefork 2")
    print(
        f"10/s and ('100/min', {args.limit_burst}): {result['completed']}/{result['tasks']} "
        f"tasks, {result['duplicates']} duplicates; claims name limits {result['ledger_limits']}"
    )
    for clock in ("store", "body"):
        f = result[clock]
        print(
            f"{clock:>5}: {f['starts']} starts over {f['span_s']} s; most in any 1 s "
            f"{f['most_in_1s']} (bound {result['bound_1s']}), in any 60 s {f['most_in_60s']} "
            f"(bound {result['bound_60s']}), fewest in a full 60 s {f['fewest_in_full_60s']}; "
            f"min gap {f['min_gap_s']} s; {f['rate_per_min']}/min"
        )


if __name__ == "__main__":
    main()
