"""Redis commands per task on the store's steady path: one take (grant and claim in one
script, as a worker's claimer that knows the store's birth) and the task's done mark, either
sent with the next take (``piggy``) or posted by the pool process (``posted``).

Run: python bench/store_commands.py [--tasks 500]. A private redis-server; INFO commandstats
before and after, by command, per task (10 buckets whose states exist already), and the
server's time in them per task (commandstats' usec: CPU-bound, but a busy machine adds to it).
"""

from __future__ import annotations

import argparse
from typing import Any

import redis

from celery_interval.demo.embedded import RedisProc
from celery_interval.schedule import ClaimTerms, Pace
from celery_interval.stores.base import DoneBatch, TaskCopy
from celery_interval.stores.redis import RedisStore

DEDUPE_TTL_US = 7_200_000_000
BUCKETS = 10


def calls(client: redis.Redis[Any]) -> dict[str, int]:
    stats: dict[str, dict[str, Any]] = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def server_us(client: redis.Redis[Any]) -> float:
    """Microseconds the server spent in commands (INFO commandstats' usec, INFO excluded)."""
    stats: dict[str, dict[str, Any]] = client.info("commandstats")
    return sum(float(v["usec"]) for k, v in stats.items() if k != "cmdstat_info")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=500)
    args = parser.parse_args()
    with RedisProc() as server:
        store = RedisStore.from_url(server.url)
        client: redis.Redis[Any] = redis.Redis.from_url(server.url)
        plain = ClaimTerms("bench", lease_us=30_000_000, lead_us=12_000, handoff_us=8_000)
        store.take(TaskCopy("b0", "first", 0), Pace(1), plain)
        terms = ClaimTerms(
            "bench", lease_us=30_000_000, lead_us=12_000, handoff_us=8_000,
            knew_born_us=store.born_us(),
        )  # fmt: skip
        previous: TaskCopy | None = None
        for i in range(4 * BUCKETS):  # every bucket's state exists
            copy = TaskCopy(f"b{i % BUCKETS}", f"warm{i}", 0)
            store.take(copy, Pace(1), terms)
            previous = copy
        for mode in ("piggy", "posted"):
            before, before_us = calls(client), server_us(client)
            for i in range(args.tasks):
                copy = TaskCopy(f"b{i % BUCKETS}", f"{mode}{i}", 0)
                if mode == "piggy":
                    done = DoneBatch((previous,), DEDUPE_TTL_US) if previous else None
                    store.take(copy, Pace(1), terms, done_first=done)
                else:
                    store.take(copy, Pace(1), terms)
                    store.prepare_post()
                    store.post_done(copy, DEDUPE_TTL_US)
                    store.settle_post(1.0)
                previous = copy
            after, spent_us = calls(client), server_us(client) - before_us
            used = {k: after[k] - before.get(k, 0) for k in after if k != "info"}
            used = {k: n for k, n in sorted(used.items()) if n}
            per = " ".join(f"{k} {n / args.tasks:.2f}" for k, n in used.items())
            print(
                f"{mode}: {sum(used.values()) / args.tasks:.2f} commands per task ({per}); "
                f"server time {spent_us / args.tasks:.1f} us per task"
            )


if __name__ == "__main__":
    main()
