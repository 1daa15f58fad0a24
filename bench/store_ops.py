"""Benchmark RedisStore: grant+claim pairs per second, client and Redis CPU per pair, and Redis
bytes per idle bucket."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import redis

from celery_interval.schedule import ClaimTerms, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore

LEASE_US = 60_000_000
INTERVAL_US = 1  # no waiting: measure the store, not the schedule


def _worker(
    url: str, prefix: str, n_buckets: int, seconds: float, start_at: float, seed: int, batch: int
) -> tuple[int, dict[str, int], float]:
    """Run grant+claim pairs from ``start_at`` for ``seconds``; return (pairs, outcomes, CPU
    seconds of this process meanwhile). With
    ``batch`` > 0 each pair is one ``take`` (grant and claim in one script, its slot due at
    once), ``batch`` of them per round trip (``take_many``)."""
    store = RedisStore.from_url(url, key_prefix=prefix)
    holder = f"bench-{os.getpid()}"
    outcomes: Counter[str] = Counter()
    pairs = 0
    i = seed * 7919
    while time.time() < start_at:
        time.sleep(0.001)
    deadline = time.monotonic() + seconds
    cpu_start_s = time.process_time()
    terms = ClaimTerms(holder, LEASE_US)
    while batch and time.monotonic() < deadline:
        takes = []
        for _ in range(batch):
            takes.append(
                (TaskCopy(f"b{i % n_buckets}", f"{seed}-{i}", 0), Pace(INTERVAL_US), terms)
            )
            i += 1
        for _grant, claimed in store.take_many(takes):
            outcomes["none" if claimed is None else claimed.outcome.value] += 1
            pairs += 1
    while not batch and time.monotonic() < deadline:
        for _ in range(50):
            bucket = f"b{i % n_buckets}"
            task_id = f"{seed}-{i}"
            g = store.grant(TaskCopy(bucket, task_id, 0), Pace(INTERVAL_US))
            c = store.claim(
                TaskCopy(bucket, task_id, 0), INTERVAL_US, g.slot, ClaimTerms(holder, LEASE_US)
            )
            outcomes[c.outcome.value] += 1
            pairs += 1
            i += 1
    cpu_s = time.process_time() - cpu_start_s
    store.close()
    return pairs, dict(outcomes), cpu_s


def _cleanup(client: redis.Redis[Any], prefix: str) -> None:
    batch: list[Any] = []
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            client.unlink(*batch)
            batch.clear()
    if batch:
        client.unlink(*batch)


@dataclass(frozen=True)
class Run:
    """One throughput run: pairs a second, CPU µs per pair of the clients and of the Redis
    process, the scripts' time per pair by INFO commandstats (elapsed, so it grows when other
    work takes the CPU from Redis), and the claims' outcomes."""

    pairs_per_s: float
    client_cpu_us: float
    redis_cpu_us: float
    script_us: float
    outcomes: Counter[str]


def _redis_cpu(client: redis.Redis[Any]) -> tuple[float, float]:
    """(used CPU seconds of the Redis process, µs spent in script calls)."""
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    scripts_us = sum(v["usec"] for k, v in stats.items() if k.startswith("cmdstat_eval"))
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), float(scripts_us)


def throughput(url: str, n_procs: int, n_buckets: int, seconds: float, batch: int = 0) -> Run:
    """Pairs per second summed over ``n_procs`` client processes, and their costs."""
    prefix = f"cibench-{uuid.uuid4().hex[:8]}:"
    start_at = time.time() + 0.5 + 0.1 * n_procs
    client: redis.Redis[Any] = redis.Redis.from_url(url)
    ctx = mp.get_context("spawn" if sys.platform == "darwin" else "fork")
    with ctx.Pool(n_procs) as pool:
        cpu_before = _redis_cpu(client)
        results = pool.starmap(
            _worker,
            [(url, prefix, n_buckets, seconds, start_at, k, batch) for k in range(n_procs)],
        )
        cpu_after = _redis_cpu(client)
    outcomes: Counter[str] = Counter()
    for _, o, _cpu in results:
        outcomes.update(o)
    _cleanup(client, prefix)
    pairs = sum(p for p, _, _ in results)
    per_pair = 1e6 / max(1, pairs)
    return Run(
        pairs_per_s=pairs / seconds,
        client_cpu_us=sum(c for _, _, c in results) * per_pair,
        # the Redis figures include the clients' start (connect, script load): a few ms
        redis_cpu_us=(cpu_after[0] - cpu_before[0]) * per_pair,
        script_us=(cpu_after[1] - cpu_before[1]) / 1e6 * per_pair,
        outcomes=outcomes,
    )


def idle_bucket_bytes(url: str, n_buckets: int) -> tuple[float, float]:
    """(MEMORY USAGE of a state key, used_memory growth) per idle bucket, marks excluded."""
    prefix = f"cibench-{uuid.uuid4().hex[:8]}:"
    client: redis.Redis[Any] = redis.Redis.from_url(url)
    store = RedisStore(client, key_prefix=prefix)
    before = int(client.info("memory")["used_memory"])
    for k in range(n_buckets):
        # a realistic idle record: granted and claimed once (claim writes current_slot, etc.)
        g = store.grant(TaskCopy(f"b{k}", "t", 0), Pace(1_000_000))
        store.claim(TaskCopy(f"b{k}", "t", 0), 1_000_000, g.slot, ClaimTerms("h", LEASE_US, 10**9))
    # Marks and ledgers are excluded: delete them before measuring the state alone.
    extra = [f"{prefix}{{b{k}}}:{kind}" for k in range(n_buckets) for kind in ("m:t:0", "l")]
    for start in range(0, len(extra), 1000):
        client.delete(*extra[start : start + 1000])
    after = int(client.info("memory")["used_memory"])
    pipe = client.pipeline(transaction=False)
    for k in range(n_buckets):
        pipe.memory_usage(f"{prefix}{{b{k}}}:s", samples=0)
    usages = [int(u) for u in pipe.execute()]
    _cleanup(client, prefix)
    client.close()
    return sum(usages) / len(usages), (after - before) / n_buckets


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="Redis to use (default: start a private redis-server)")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each run")
    parser.add_argument("--procs", default="1,4", help="client process counts")
    parser.add_argument("--buckets", default="1,10000", help="bucket counts")
    parser.add_argument("--idle-buckets", type=int, default=10_000)
    parser.add_argument(
        "--batch",
        default="0",
        help="takes per round trip, comma-separated (0: a grant, then a claim, per pair)",
    )
    args = parser.parse_args(argv)

    server = None
    url = args.url
    if url is None:
        from celery_interval.demo.embedded import RedisProc

        server = RedisProc()
        url = server.url
    try:
        info = redis.Redis.from_url(url).info("server")
        print(
            f"Redis {info['redis_version']} at {url.split('@')[-1]}, "
            f"{os.cpu_count()} CPUs, {args.seconds:g} s per run\n"
        )
        print(
            "| client processes | buckets | takes per trip | grant+claim pairs/s "
            "| client CPU µs/pair | Redis CPU µs/pair | script time µs/pair | claims |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---|")
        for batch in (int(x) for x in args.batch.split(",")):
            for n_procs in (int(x) for x in args.procs.split(",")):
                for n_buckets in (int(x) for x in args.buckets.split(",")):
                    run = throughput(url, n_procs, n_buckets, args.seconds, batch)
                    shown = ", ".join(f"{k} {v}" for k, v in sorted(run.outcomes.items()))
                    per_trip = str(batch) if batch else "grant, claim"
                    print(
                        f"| {n_procs} | {n_buckets:,} | {per_trip} | {run.pairs_per_s:,.0f} "
                        f"| {run.client_cpu_us:.1f} | {run.redis_cpu_us:.1f} "
                        f"| {run.script_us:.1f} | {shown} |",
                        flush=True,
                    )
        usage, growth = idle_bucket_bytes(url, args.idle_buckets)
        print(
            f"\nIdle bucket (state hash only; marks and ledger excluded, {args.idle_buckets:,} "
            "buckets): "
            f"MEMORY USAGE {usage:.0f} bytes; used_memory growth {growth:.0f} bytes/bucket"
        )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
