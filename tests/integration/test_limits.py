"""Several limits of one bucket on real workers: the interval and a tighter rate at once."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest

from celery_interval.schedule.state import MAX_LEAD_US
from celery_interval.starts import happened, is_readmit
from celery_interval.stores.redis import RedisStore

pytestmark = pytest.mark.slow

INTERVAL_S = 0.05
PER_S = 8  # the extra limit "8/s": tighter than the interval's 20/s
TASKS = 80
#: How close (store-clock µs) a start must be to the limit's first free time.
SLACK_US = 1_000


def test_an_interval_and_a_tighter_rate_hold_at_once_and_the_rate_is_saturated(
    make_pool: Any,
) -> None:
    """Interval 50 ms and "8/s", 2 workers x 3 processes, 80 tasks sent at once: in every
    1-s window of the starts the store admitted at most 8 (the limit holds, on the store's
    clock), the interval holds between any two, the store leaves the limit idle only for want
    of a claim (a claim that came while it was busy got its first free start), starts come in
    ticket order (FIFO), every claim in the ledger names the limit, and interval_stats shows
    it. How fast a loaded machine's workers claim is the benchmark's (BENCHMARKS, section 8)."""
    queue = f"q{uuid.uuid4().hex[:10]}"
    pool = make_pool(
        INTERVAL_S, queue=queue, conf={"interval_queues": {queue: {"limits": [f"{PER_S}/s"]}}}
    )
    pool.start(2, concurrency=3)
    store = RedisStore.from_url(pool.store)
    ids = pool.send(TASKS)
    pool.wait_records(TASKS, timeout_s=90)
    entries = [f for _, f in store.ledger(queue, count=10_000)]
    starts = happened(entries)
    admitted = sorted(int(f["start"]) for f in starts)
    for i, first_us in enumerate(admitted):
        in_window = [s for s in admitted[i:] if s < first_us + 1_000_000]
        assert len(in_window) <= PER_S, [round((s - first_us) / 1e3) for s in in_window]
    gaps_us = [b - a for a, b in itertools.pairwise(admitted)]
    assert min(gaps_us) >= INTERVAL_S * 1e6, "the interval broken"
    ran = {f["task"]: int(f["start"]) for f in starts}  # a readmit replaces its earlier start
    assert sorted(ran) == sorted(ids), "every task started"
    span_s = (max(ran.values()) - min(ran.values())) / 1e6
    rate = (len(ran) - 1) / span_s
    print(f"{len(ran)} starts in {span_s:.2f} s: {rate:.2f}/s; min gap {min(gaps_us) / 1e3} ms")
    admissions = sorted((int(f["start"]), int(f["now"])) for f in entries if f["op"] == "claim:OK")
    # (claim, start) in ms after the limit was free again, of each start after another
    early = [
        ((now_us - free_us) / 1e3, (start_us - free_us) / 1e3)
        for (prev_us, _), (start_us, now_us) in itertools.pairwise(admissions)
        for free_us in [prev_us + 1_000_000 // PER_S]
        if now_us < free_us - SLACK_US
    ]
    assert len(early) >= TASKS // 2, f"only {len(early)} claims came while the limit was busy"
    # a start is never sooner than a handoff after its claim: at most the claim's lead, which
    # a slow round trip to the store stretches up to MAX_LEAD_US
    reach_ms = MAX_LEAD_US / 1e3
    idle = [
        (claim_ms, start_ms)
        for claim_ms, start_ms in early
        if start_ms > max(0.0, claim_ms + reach_ms) + SLACK_US / 1e3
    ]
    assert not idle, f"claimed before the limit was free, started after it (ms): {idle}"
    by_ticket = sorted((int(f["ticket"]), int(f["start"])) for f in starts if not is_readmit(f))
    assert [s for _, s in by_ticket] == sorted(s for _, s in by_ticket), "not in ticket order"
    recorded = f"{1_000_000 // PER_S}:1"
    assert {f.get("limits") for f in entries if f["op"].startswith("claim:")} == {recorded}
    replies = pool.app.control.broadcast(
        "interval_stats",
        arguments={"top": 0, "tasks": 0},
        reply=True,
        limit=len(pool.workers),
        timeout=10.0,
    )
    shown = [s[queue]["limits"] for r in replies for s in r.values() if queue in s]
    limit = {"limit": f"{PER_S}/s", "rate": f"{PER_S}/s", "interval_s": 1 / PER_S, "burst": 1}
    assert shown and all(x == [limit] for x in shown), replies
