"""fair.lua against the model: keys of one fair outer bucket, run through both stores side by
side, give the same replies, records and share at every step."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st
import redis
from hypothesis import HealthCheck, given, settings

from celery_interval.schedule import ClaimTerms, Limit, Outcome, Pace, Slot
from celery_interval.schedule.outer import Outer
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.memory import MemoryStore
from celery_interval.stores.redis import RedisStore
from tests.helpers.cluster_model import ClusterModel
from tests.helpers.fair_sim import T0_US


@dataclass(frozen=True)
class KeyPlan:
    """One key's work: its weight, own interval, cost, cap, tasks, arrival and habits."""

    weight: int
    own_us: int
    cost: int
    cap: int | None
    tasks: int
    arrive_us: int
    takes: bool  # its worker takes (grant and claim in one call) rather than grant, then claim
    again: bool  # its worker claims an admitted start again (a lost reply)
    late_us: int | None  # its pool process reaches each task this late: it claims again
    handoff_us: int  # its worker's time to hand a task to a pool process
    stops_after: int | None  # its worker stops claiming after this many claims (it died)


key_plans = st.builds(
    KeyPlan,
    weight=st.sampled_from([1, 1, 2, 3]),
    own_us=st.sampled_from([1, 1, 30_000, 100_000]),
    cost=st.sampled_from([1, 1, 2]),
    cap=st.sampled_from([None, None, 1]),
    tasks=st.integers(1, 8),
    arrive_us=st.integers(0, 200_000),
    takes=st.booleans(),
    again=st.booleans(),
    late_us=st.sampled_from([None, None, 1, 15_000, 60_000]),
    handoff_us=st.sampled_from([0, 0, 8_000]),
    stops_after=st.one_of(st.none(), st.integers(1, 6)),
)
#: The outer's control steps: when (µs after the start) and which.
controls = st.lists(
    st.tuples(
        st.integers(0, 400_000), st.sampled_from(["pause", "unpause", "set_interval", "unset"])
    ),
    max_size=4,
)
outers = st.builds(
    Outer,
    st.just("api"),
    st.sampled_from([5_000, 20_000]),
    st.sampled_from([1, 1, 2]),
    st.sampled_from([(), (Limit(100_000, 4),)]),
)


def _same(model: MemoryStore, store: RedisStore, buckets: list[str]) -> None:
    assert store.read_fair("api") == model.read_fair("api")
    for bucket in [*buckets, "api"]:
        assert store.read_state(bucket) == model.read_state(bucket), bucket
        assert store.read_places(bucket) == model.read_places(bucket), bucket


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    plans=st.lists(key_plans, min_size=2, max_size=4),
    outer=outers,
    lead_us=st.sampled_from([0, 5_000, 20_000]),
    steps=controls,
)
def test_fair_lua_matches_model(
    redis_client: redis.Redis[Any],
    plans: list[KeyPlan],
    outer: Outer,
    lead_us: int,
    steps: list[tuple[int, str]],
) -> None:
    _run(redis_client, MemoryStore, plans, outer, lead_us, steps)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    plans=st.lists(key_plans, min_size=2, max_size=3),
    outer=outers,
    lead_us=st.sampled_from([0, 20_000]),
)
def test_fair_lua_matches_model_on_cluster(
    cluster_client: redis.RedisCluster[Any], plans: list[KeyPlan], outer: Outer, lead_us: int
) -> None:
    """The same on a Redis Cluster: the share's hash in its outer's hash slot."""
    _run(cluster_client, ClusterModel, plans, outer, lead_us, [])


def _run(
    client: Any,
    model_type: type[MemoryStore],
    plans: list[KeyPlan],
    outer: Outer,
    lead_us: int,
    steps: list[tuple[int, str]],
) -> None:
    """The keys' workers' steps and the outer's control ``steps``, event by event, through
    both stores."""
    client.flushall()  # each example starts empty (the fixture flushes once)
    now = [T0_US]
    buckets = [f"api:k{i}" for i in range(len(plans))]
    nests = dict.fromkeys(buckets, outer)
    model = model_type(clock_us=lambda: now[0], nesting=nests.get)
    store = RedisStore(client, now_us=lambda: now[0], nesting=nests.get)
    left = [p.tasks for p in plans]
    claims = [0] * len(plans)
    events: list[tuple[int, int, str, Slot | None]] = [
        (T0_US + p.arrive_us, i, "grant", None) for i, p in enumerate(plans)
    ]
    events += [(T0_US + at_us, -1, kind, None) for at_us, kind in steps]
    heapq.heapify(events)
    readmits: set[tuple[int, int]] = set()  # (key, task) whose start a pool process missed
    done = 0
    while events and done < 120:
        now[0], i, kind, slot = heapq.heappop(events)
        done += 1
        if i < 0:
            assert _control(store, kind, outer) == _control(model, kind, outer)
            _same(model, store, buckets)
            continue
        plan = plans[i]
        copy = TaskCopy(buckets[i], f"t{plan.tasks - left[i]}", 0)
        key_outer = Outer(outer.bucket, outer.interval_us, outer.burst, outer.limits, plan.weight)
        pace = Pace(plan.own_us, cost=plan.cost)
        terms = ClaimTerms(
            f"w{i}", 30_000_000, lead_us, plan.handoff_us, cap=plan.cap, cost=plan.cost
        )
        if kind == "grant" and plan.takes:
            expected = model.take_nested(copy, pace, terms, key_outer)
            assert store.take_nested(copy, pace, terms, key_outer) == expected
            granted, claimed = expected
        elif kind == "grant":
            granted = model.grant_nested(copy, pace, key_outer)
            assert store.grant_nested(copy, pace, key_outer) == granted
            claimed = None
        else:
            assert slot is not None
            claims[i] += 1
            if plan.stops_after is not None and claims[i] > plan.stops_after:
                continue
            claimed = model.claim_nested(copy, plan.own_us, slot, terms, key_outer)
            assert store.claim_nested(copy, plan.own_us, slot, terms, key_outer) == claimed
        _same(model, store, buckets)
        if kind == "grant":
            slot = granted.slot
            if claimed is None:
                at_us = now[0] + max(0, granted.delay_us - lead_us)
                heapq.heappush(events, (at_us, i, "claim", slot))
                continue
        assert slot is not None
        if claimed is None or claimed.outcome is Outcome.RETICKET:
            heapq.heappush(events, (now[0] + 1, i, "grant", None))
        elif claimed.outcome in (Outcome.WAIT, Outcome.FULL):
            heapq.heappush(events, (now[0] + max(1, claimed.delay_us), i, "claim", slot))
        elif claimed.outcome is Outcome.PAUSED:  # its worker polls the pause
            heapq.heappush(events, (now[0] + 50_000, i, "claim", slot))
        elif claimed.outcome is Outcome.OK:
            if plan.again:
                again = model.claim_nested(copy, plan.own_us, slot, terms, key_outer)
                assert store.claim_nested(copy, plan.own_us, slot, terms, key_outer) == again
                _same(model, store, buckets)
            task = plan.tasks - left[i]
            if plan.late_us is not None and (i, task) not in readmits:
                readmits.add((i, task))  # its start passes unheard: a readmit, once a task
                late_at_us = now[0] + claimed.delay_us + plan.late_us
                heapq.heappush(events, (late_at_us, i, "claim", slot))
                continue
            left[i] -= 1
            if left[i] > 0:
                heapq.heappush(events, (now[0] + claimed.delay_us, i, "grant", None))


def _control(store: Any, kind: str, outer: Outer) -> Any:
    """A control step on the outer bucket: its status after it."""
    if kind == "set_interval":
        return store.set_interval("api", outer.interval_us, 2 * outer.interval_us)
    if kind == "unset":
        return store.unset_interval("api", outer.interval_us)
    return getattr(store, kind)("api", outer.interval_us)
