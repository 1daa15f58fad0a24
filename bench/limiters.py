"""Cost-weighted limit decisions a second, and their exactness: ours, limits, throttled-py.

Each system decides "may this call of cost c go now?" (yes or no, never wait) against one
Redis, from several client processes at once, far faster than the limit allows. Every yes is
recorded with its time and cost; exactness is the most cost admitted in any window of a
second, against the system's own promise for that window.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import random
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

# bench/limits.py would shadow the `limits` library measured here.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(__file__)]

RATE_PER_S = 200  # units a second
BURST = 5  # units; the largest cost
WINDOW_S = 1.0

#: A system's decision: (cost) -> the admitted time in µs (wall clock of this host), or None.
Decide = Callable[[int], "int | None"]


def _celery_interval(url: str, key: str) -> Decide:
    from celery_interval.schedule import ClaimTerms, Outcome, Pace
    from celery_interval.stores.base import TaskCopy
    from celery_interval.stores.redis import RedisStore

    store = RedisStore.from_url(url)
    interval_us = 1_000_000 // RATE_PER_S
    counter = itertools.count()
    holder = f"bench-{os.getpid()}"

    def decide(cost: int) -> int | None:
        copy = TaskCopy(key, f"{holder}-{next(counter)}", 0)
        pace = Pace(interval_us, burst=BURST, cost=cost, not_after_in_us=0)
        terms = ClaimTerms(holder, 60_000_000, lead_us=20_000, burst=BURST, cost=cost)
        _grant, claimed = store.take(copy, pace, terms)
        if claimed is None or claimed.outcome is not Outcome.OK:
            return None
        return claimed.now_us + claimed.delay_us  # the admitted start, on the store's clock

    return decide


def _limits(url: str, key: str) -> Decide:
    from limits import RateLimitItemPerSecond
    from limits.storage import RedisStorage
    from limits.strategies import MovingWindowRateLimiter

    limiter = MovingWindowRateLimiter(RedisStorage(url))
    item = RateLimitItemPerSecond(RATE_PER_S)

    def decide(cost: int) -> int | None:
        return time.time_ns() // 1000 if limiter.hit(item, key, cost=cost) else None

    return decide


def _throttled(url: str, key: str) -> Decide:
    from throttled import RateLimiterType, Throttled, rate_limiter
    from throttled.store import RedisStore

    limiter = Throttled(
        key=key,
        using=RateLimiterType.GCRA.value,
        quota=rate_limiter.per_sec(RATE_PER_S, burst=BURST),
        store=RedisStore(server=url),
    )

    def decide(cost: int) -> int | None:
        result = limiter.limit(key, cost=cost)
        return None if result.limited else time.time_ns() // 1000

    return decide


SYSTEMS: dict[str, tuple[Callable[[str, str], Decide], str, float]] = {
    # name: (factory, its promise for a window of WINDOW_S, that bound in units)
    "celery_interval": (_celery_interval, "burst + span x rate", BURST + RATE_PER_S * WINDOW_S),
    "limits (moving window)": (_limits, "rate x window", RATE_PER_S * WINDOW_S),
    "throttled-py (GCRA)": (_throttled, "burst + span x rate", BURST + RATE_PER_S * WINDOW_S),
}


def _client(
    name: str, url: str, key: str, seconds: float, start_at: float, seed: int
) -> tuple[int, list[tuple[int, int]]]:
    decide = SYSTEMS[name][0](url, key)
    rng = random.Random(seed)
    admitted: list[tuple[int, int]] = []
    decisions = 0
    while time.time() < start_at:
        time.sleep(0.001)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        cost = rng.randint(1, BURST)
        at_us = decide(cost)
        decisions += 1
        if at_us is not None:
            admitted.append((at_us, cost))
    return decisions, admitted


def most_in_window(admitted: list[tuple[int, int]], window_us: int) -> int:
    """The most cost admitted in any half-open window of ``window_us``."""
    admitted = sorted(admitted)
    most = total = 0
    left = 0
    for at_us, cost in admitted:
        total += cost
        while admitted[left][0] <= at_us - window_us:
            total -= admitted[left][1]
            left += 1
        most = max(most, total)
    return most


def run(name: str, url: str, procs: int, seconds: float) -> dict[str, Any]:
    key = f"bench-{uuid.uuid4().hex[:8]}"
    start_at = time.time() + 0.5 + 0.2 * procs
    with mp.get_context("fork").Pool(procs) as pool:
        results = pool.starmap(
            _client, [(name, url, key, seconds, start_at, k) for k in range(procs)]
        )
    decisions = sum(d for d, _ in results)
    admitted = [a for _, got in results for a in got]
    units = sum(c for _, c in admitted)
    span_s = (max(a for a, _ in admitted) - min(a for a, _ in admitted)) / 1e6 if admitted else 0
    return {
        "system": name,
        "decisions_per_s": decisions / seconds,
        "admitted_units_per_s": units / span_s if span_s else 0.0,
        "most_in_window": most_in_window(admitted, round(WINDOW_S * 1e6)),
        "bound": SYSTEMS[name][2],
        "promise": SYSTEMS[name][1],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="each system once per round")
    args = parser.parse_args(argv)
    from celery_interval.demo.embedded import RedisProc

    with RedisProc() as server:
        print(
            f"{args.procs} client processes, {args.seconds:g} s per run, limit {RATE_PER_S} "
            f"units/s, costs 1..{BURST} (burst {BURST}), {os.cpu_count()} CPUs\n"
        )
        print("| system | decisions/s | admitted units/s | most units in any 1 s | its bound |")
        print("|---|---:|---:|---:|---:|")
        names = list(SYSTEMS)
        for round_no in range(args.rounds):
            for name in names if round_no % 2 == 0 else reversed(names):
                r = run(name, server.url, args.procs, args.seconds)
                print(
                    f"| {r['system']} | {r['decisions_per_s']:,.0f} | "
                    f"{r['admitted_units_per_s']:,.1f} | {r['most_in_window']} | "
                    f"{r['bound']:g} ({r['promise']}) |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
