"""Client CPU of one RedisStore.take (with the previous task's done mark), on a private
redis-server: the Python cost of the store path a worker pays per task.

Run: python bench/take_cpu.py [--calls 20000]. Prints CPU and wall time per call.
"""

from __future__ import annotations

import argparse
import time

from celery_interval.demo.embedded import RedisProc
from celery_interval.schedule import ClaimTerms, Pace
from celery_interval.stores.base import DoneBatch, TaskCopy
from celery_interval.stores.redis import RedisStore

WARMUP_CALLS = 2_000
TERMS = ClaimTerms("bench", lease_us=30_000_000, lead_us=12_000, handoff_us=8_000)
DEDUPE_TTL_US = 7_200_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    with RedisProc() as server:
        store = RedisStore.from_url(server.url)
        previous: TaskCopy | None = None

        def take(i: int) -> TaskCopy:
            copy = TaskCopy(f"b{i % 100}", f"t{i}", 0)
            done = DoneBatch((previous,), DEDUPE_TTL_US) if previous else None
            store.take(copy, Pace(1), TERMS, done_first=done)
            return copy

        for i in range(WARMUP_CALLS):
            previous = take(i)
        cpu_s, wall_s = time.process_time(), time.perf_counter()
        for i in range(WARMUP_CALLS, WARMUP_CALLS + args.calls):
            previous = take(i)
        cpu_s, wall_s = time.process_time() - cpu_s, time.perf_counter() - wall_s
        store.close()
    print(
        f"{args.calls} takes: client CPU {cpu_s / args.calls * 1e6:.1f} µs per call, "
        f"wall {wall_s / args.calls * 1e6:.1f} µs"
    )


if __name__ == "__main__":
    main()
