"""100,000 buckets on a Redis Cluster of three masters: takes per second, memory per master.

Starts three private redis-servers in cluster mode (the test suite's assembly), then from one
client process takes one start in each of ``--buckets`` buckets (grant and claim in one
script, ``--batch`` takes per round trip to each master), twice over: the first pass makes
every bucket's state, the second finds it. Prints keys and ``used_memory`` per master and the
spread of buckets over the masters.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers: the cluster

from celery_interval.demo.embedded import RedisProc
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore
from tests.helpers.failover import assemble_cluster, cluster_url

INTERVAL_US = (
    1_000  # a bucket's second take is due at once; a new one waits 20 ms (no birth marker)
)


def one_pass(store: RedisStore, buckets: int, batch: int, tag: str) -> tuple[float, dict[str, int]]:
    """Seconds for one take in each bucket, and the claims' outcomes."""
    terms = ClaimTerms(f"bench-{os.getpid()}", 60_000_000, lead_us=20_000)
    outcomes: dict[str, int] = {}
    begun = time.monotonic()
    for first in range(0, buckets, batch):
        takes = [
            (TaskCopy(f"t{k}", f"{tag}{k}", 0), Pace(INTERVAL_US), terms)
            for k in range(first, min(buckets, first + batch))
        ]
        for _grant, claimed in store.take_many(takes):
            name = "none" if claimed is None else claimed.outcome.value
            outcomes[name] = outcomes.get(name, 0) + 1
    return time.monotonic() - begun, outcomes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--buckets", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args(argv)
    nodes = [RedisProc(cluster=True) for _ in range(3)]
    try:
        assemble_cluster(nodes)
        store = RedisStore.from_url(cluster_url(nodes))
        clients: list[Any] = [redis.Redis(host="127.0.0.1", port=n.port) for n in nodes]
        before = [int(c.info("memory")["used_memory"]) for c in clients]
        print(
            f"{args.buckets:,} buckets, 3 masters, {args.batch} takes a trip, {os.cpu_count()} CPUs"
        )
        print("| pass | seconds | takes/s | claims |")
        print("|---|---:|---:|---|")
        for tag in ("new", "again"):
            seconds, outcomes = one_pass(store, args.buckets, args.batch, tag)
            shown = ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items()))
            print(
                f"| {tag} | {seconds:.1f} | {args.buckets / seconds:,.0f} | {shown} |", flush=True
            )
            assert outcomes.get(Outcome.OK.value, 0) + outcomes.get("none", 0) == args.buckets
        states = [sum(1 for _ in c.scan_iter(match="*:s", count=1000)) for c in clients]
        after = [int(c.info("memory")["used_memory"]) for c in clients]
        print(
            "\n| master | bucket states | used_memory growth (MB) | bytes per bucket (all keys) |"
        )
        print("|---|---:|---:|---:|")
        for i, (n, b, a) in enumerate(zip(states, before, after, strict=True)):
            print(f"| {i + 1} | {n:,} | {(a - b) / 2**20:.1f} | {(a - b) / max(1, n):,.0f} |")
        store.close()
    finally:
        for node in nodes:
            node.stop()


if __name__ == "__main__":
    main()
