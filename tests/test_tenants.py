"""Tenants on one queue on real workers: one key's backlog parks, every other key starts at once."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from typing import Any

import pytest
from pool import Pool
from test_dropin import bucket_claims

pytestmark = pytest.mark.slow

TENANT_INTERVAL_S = 0.02
FLOOD = 1500


def tenant_pool(make_pool: Any, broker: str, **conf: Any) -> Pool:
    pool: Pool = make_pool(
        TENANT_INTERVAL_S,
        broker=broker,
        env_extra={"CI_TEST_TENANT_INTERVAL": str(TENANT_INTERVAL_S)},
        conf=conf,
        loglevel="INFO",
    )
    pool.recorder.flushdb()
    return pool


def send_tenants(pool: Pool, calls: list[tuple[str, int]]) -> list[str]:
    """Send ``workerapp.tenant(key, i)`` for each call, in order; returns the task ids."""
    ids = []
    with pool.app.producer_or_acquire() as producer:
        for key, i in calls:
            result = pool.app.send_task(
                "workerapp.tenant", args=(key, i), queue=pool.queue, producer=producer
            )
            ids.append(result.id)
    return ids


def starts_by_key(pool: Pool) -> dict[str, list[dict[str, Any]]]:
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in pool.records():
        if record["kind"] == "tenant":
            by_key[record["args"][0]].append(record)
    for records in by_key.values():
        records.sort(key=lambda r: r["us"])
    return by_key


def wait_for(pool: Pool, done: Any, timeout_s: float) -> dict[str, list[dict[str, Any]]]:
    deadline = time.monotonic() + timeout_s
    while True:
        by_key = starts_by_key(pool)
        if done(by_key) or time.monotonic() > deadline:
            return by_key
        time.sleep(0.1)


def assert_key_paced(pool: Pool, key: str, interval_s: float) -> None:
    """The starts the store admitted in the key's bucket (its ledger), each an interval apart."""
    claims = bucket_claims(pool, f"{pool.queue}:{key}")
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(claims)]
    assert not gaps or min(gaps) >= round(interval_s * 1e6), (key, sorted(gaps)[:5])


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_a_flood_never_blocks_other_tenants(make_pool: Any, broker: str) -> None:
    """One key sends a backlog far beyond what a worker holds; then 51 keys send a few tasks
    each. Every new key's first task starts within about a second of its send, each key keeps
    its own pace, the flood keeps exactly its interval, and every task runs once."""
    pool = tenant_pool(make_pool, broker)
    pool.start(2, concurrency=2)
    flood_ids = send_tenants(pool, [("a", i) for i in range(FLOOD)])
    others = [("b", i) for i in range(5)] + [(f"t{k}", i) for k in range(50) for i in range(2)]
    sent_us = pool.store_now_us()
    other_ids = send_tenants(pool, others)
    keys = {key for key, _ in others}

    by_key = wait_for(pool, lambda got: keys <= set(got), timeout_s=30.0)
    firsts_s = {key: (by_key[key][0]["us"] - sent_us) / 1e6 for key in keys if by_key.get(key)}
    assert set(firsts_s) == keys, f"keys never started: {sorted(keys - set(firsts_s))}"
    worst = max(firsts_s.values())
    print(f"FIRST START of 51 new keys behind {FLOOD} of key a: worst {worst:.3f}s")
    assert worst <= 2.0, sorted(firsts_s.items(), key=lambda kv: -kv[1])[:5]

    by_key = wait_for(
        pool, lambda got: sum(len(v) for v in got.values()) >= FLOOD + len(others), 90.0
    )
    seen = [r["id"] for records in by_key.values() for r in records]
    expected = flood_ids + other_ids
    assert sorted(seen) == sorted(expected), (
        f"missing={len(set(expected) - set(seen))} doubled={len(seen) - len(set(seen))}"
    )
    for key in by_key:
        assert_key_paced(pool, key, TENANT_INTERVAL_S)
    flood = by_key["a"]
    span_s = (flood[-1]["us"] - flood[0]["us"]) / 1e6
    utilization = (len(flood) - 1) * TENANT_INTERVAL_S / span_s
    print(f"FLOOD {len(flood)} starts over {span_s:.2f}s: utilization {utilization:.3f}")
    assert utilization >= 0.9
