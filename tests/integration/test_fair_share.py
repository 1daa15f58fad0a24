"""A fair outer bucket on real workers: tenants share its starts by weight, and it stays exact."""

from __future__ import annotations

import itertools
import json
import uuid
from typing import Any

import pytest

from celery_interval.config import settings_of
from celery_interval.monitor.collector import Collector
from celery_interval.starts import happened
from celery_interval.stores.redis import RedisStore
from tests.helpers.pool import Pool, celery_cli
from tests.helpers.pool_tasks import send_tenants

pytestmark = pytest.mark.slow

OUTER_S = 0.04  # the shared limit: 25 starts a second for all tenants together
TENANT_S = 0.001  # each tenant's own interval: no bound below the shared one
FLOOD, SMALL, GOLD = 150, 10, 30


def test_tenants_share_a_fair_outer_by_weight_behind_a_flood(make_pool: Any) -> None:
    """A flood tenant's 150 tasks sent first; once it runs, a small tenant's 10 (weight 1) and
    a gold tenant's 30 (weight 3). Fair: while the small tenant has work, the flood gets about
    one start for each of the small tenant's and a third of the gold tenant's, on the store's
    clock (the outer not fair, a run here gave the flood 17 and the gold tenant 18 for the small
    one's 10). Every task runs once and all starts are 40 ms or more apart."""
    queue = f"q{uuid.uuid4().hex[:10]}"
    queues: dict[str, Any] = {
        queue: {"interval": OUTER_S, "fair": True},
        f"{queue}:*": {"outer": queue},
        f"{queue}:gold": {"weight": 3},
    }
    pool: Pool = make_pool(
        OUTER_S,
        queue=queue,
        env_extra={"CI_TEST_TENANT_INTERVAL": str(TENANT_S)},
        conf={"interval_queues": queues},
    )
    pool.start(2, concurrency=2)
    ids = send_tenants(pool, [("flood", i) for i in range(FLOOD)])
    pool.wait_records(10, kind="tenant", timeout_s=60)
    later = [("small", i) for i in range(SMALL)] + [("gold", i) for i in range(GOLD)]
    ids += send_tenants(pool, sorted(later, key=lambda call: call[1]))
    pool.wait_records(FLOOD // 3, kind="tenant", timeout_s=60)
    _shows_the_shares(pool)

    store = RedisStore.from_url(pool.store, nesting=settings_of(pool.app).outer_of)
    records = pool.wait_records(len(ids), kind="tenant", timeout_s=120)
    ran = [r["id"] for r in records]
    missing, doubled = set(ids) - set(ran), len(ran) - len(set(ran))
    assert (len(ran), len(missing), doubled) == (len(ids), 0, 0), "every task ran once"
    starts: dict[str, list[int]] = {}
    for tenant in ("flood", "small", "gold"):
        entries = [f for _, f in store.ledger(f"{queue}:{tenant}", count=10_000)]
        by_task = {f["task"]: int(f["start"]) for f in happened(entries)}  # a readmit's last
        starts[tenant] = sorted(by_task.values())
    everything = sorted(s for own in starts.values() for s in own)
    assert min(b - a for a, b in itertools.pairwise(everything)) >= OUTER_S * 1e6

    first, last = starts["small"][0], starts["small"][-1]
    within = {t: sum(first <= s <= last for s in own) for t, own in starts.items()}
    print(f"starts while the small tenant ran: {within}")
    assert within["flood"] <= 1.3 * SMALL + 2, within
    assert within["gold"] >= 2 * within["flood"], within


def _shows_the_shares(pool: Pool) -> None:
    """While the flood is backlogged: ``interval status`` shows each tenant's weight, its share
    (the waiting ones' add up to 1) and its achieved rate; ``interval_stats`` shows the
    tenants its worker holds; the exporter's rows carry weight and share."""
    shown = celery_cli(pool, "interval", "status", "--match", f"{pool.queue}:*", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {row["queue"].split(":")[1]: row["fair"] for row in json.loads(shown.stdout)["queues"]}
    assert {k: rows[k]["weight"] for k in ("flood", "gold")} == {"flood": 1, "gold": 3}, rows
    assert rows["flood"]["waiting"] and rows["flood"]["rate_per_s"] > 0, rows
    assert abs(sum(r["share"] for r in rows.values() if r["waiting"]) - 1) < 1e-3, rows
    assert all(r["outer"] == pool.queue and r["backlog"] >= 0 for r in rows.values()), rows
    replies = pool.app.control.broadcast(
        "interval_stats", arguments={"top": 0}, reply=True, limit=2, timeout=10
    )
    held = [row for reply in replies for stats in reply.values() for b, row in stats.items()
            if b.startswith(f"{pool.queue}:")]  # fmt: skip
    assert held and all(row["fair"]["outer"] == pool.queue for row in held), replies
    collector = Collector(pool.app, inspect_timeout_s=1.0, rescan_s=0.0)
    try:
        frame = collector.refresh()
    finally:
        collector.stop()
    weights = {r.bucket: r.fair_weight for r in frame.rows if r.bucket.startswith(pool.queue)}
    assert weights.get(f"{pool.queue}:flood") == 1, weights
