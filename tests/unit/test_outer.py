"""Nested buckets in the model: the outer budget holds over all inner buckets, each its own."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from celery_interval import schedule
from celery_interval.schedule import ClaimTerms, Limit, Limits, Outcome, Pace, Slot
from celery_interval.schedule.outer import Outer
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.memory import MemoryStore
from tests.helpers.schedule_checks import assert_windows

ML = schedule.MAX_LEAD_US
T0_US = 1_800_000_000_000_000
LEASE_US = 10**9


def _store(now: list[int], *, old: bool = True) -> MemoryStore:
    """A MemoryStore on ``now``; ``old``: its birth marker long ago (new buckets start at once)."""
    store = MemoryStore(clock_us=lambda: now[0])
    if old:
        store._born = T0_US - 10**9
    return store


def _terms(lead_us: int = 0, cost: int = 1, handoff_us: int = 0) -> ClaimTerms:
    return ClaimTerms("w1", LEASE_US, lead_us, handoff_us, cost=cost)


def test_three_inner_buckets_share_the_outer_interval() -> None:
    """Three tenants at 50 ms inside 40 ms: the tickets' slots interleave 40 ms apart, each
    tenant's 50 ms or more apart, and every start at its slot is admitted."""
    now = [T0_US]
    store = _store(now)
    outer = Outer("api", 40_000)
    slots = []
    for i in range(4):
        for tenant in ("api:a", "api:b", "api:c"):
            copy = TaskCopy(tenant, f"t{i}", 0)
            slots.append((tenant, store.grant_nested(copy, Pace(50_000), outer)))
    assert [g.slot_us - T0_US for _, g in slots] == [40_000 * i for i in range(12)]
    for tenant, granted in sorted(slots, key=lambda s: s[1].slot_us):
        now[0] = granted.slot_us
        copy = TaskCopy(tenant, f"t{granted.ticket - 1}", 0)
        claimed = store.claim_nested(copy, 50_000, granted.slot, _terms(), outer)
        assert (claimed.outcome, claimed.delay_us) == (Outcome.OK, 0)


def test_the_outer_refusal_changes_neither_record() -> None:
    """A claim the outer's budget refuses is a WAIT that leaves both records as they were; a
    grant past its deadline takes no ticket in either."""
    now = [T0_US]
    store = _store(now)
    outer = Outer("api", 100_000)
    _, claimed = store.take_nested(TaskCopy("api:a", "t1", 0), Pace(1_000), _terms(), outer)
    assert claimed is not None and claimed.outcome is Outcome.OK
    granted = store.grant_nested(TaskCopy("api:b", "t1", 0), Pace(1_000), outer)
    assert granted.delay_us == 100_000, "the outer's next slot"
    before = store.read_state("api:b"), store.read_state("api")
    early = Slot(granted.epoch, granted.slot_us - 100_000)  # a slot the inner alone would allow
    refused = store.claim_nested(TaskCopy("api:b", "t1", 0), 1_000, early, _terms(), outer)
    assert (refused.outcome, refused.delay_us) == (Outcome.WAIT, 100_000)
    assert (store.read_state("api:b"), store.read_state("api")) == before
    late = store.grant_nested(
        TaskCopy("api:c", "t1", 0), Pace(1_000, not_after_in_us=50_000), outer
    )
    assert (late.outcome, late.ticket) == (Outcome.WAIT, 0)
    assert store.read_state("api") == before[1]


def test_a_late_claim_of_a_short_inner_interval_gets_the_handoff_up_to_the_outers() -> None:
    """A 1 ms tenant inside a 20 ms account claims after its slot: its start is the handoff
    (8 ms) after the claim, not 1 ms (its own interval), since the account spaces its starts;
    a plain 1 ms bucket keeps the 1 ms."""
    now = [T0_US]
    store = _store(now)
    outer = Outer("api", 20_000)
    granted = store.grant_nested(TaskCopy("api:a", "t1", 0), Pace(1_000), outer)
    now[0] = granted.slot_us + 5_000
    terms = _terms(lead_us=20_000, handoff_us=8_000)
    claimed = store.claim_nested(TaskCopy("api:a", "t1", 0), 1_000, granted.slot, terms, outer)
    assert (claimed.outcome, claimed.delay_us) == (Outcome.OK, 8_000)
    plain = store.grant(TaskCopy("solo", "t1", 0), Pace(1_000))
    alone = store.claim(TaskCopy("solo", "t1", 0), 1_000, plain.slot, terms)
    assert (alone.outcome, alone.delay_us) == (Outcome.OK, 1_000)


def test_a_paused_outer_pauses_its_inner_buckets() -> None:
    now = [T0_US]
    store = _store(now)
    outer = Outer("api", 1_000)
    store.pause("api", 1_000)
    granted, claimed = store.take_nested(TaskCopy("api:a", "t1", 0), Pace(1_000), _terms(), outer)
    assert granted.paused and claimed is None
    paused = store.claim_nested(TaskCopy("api:a", "t1", 0), 1_000, granted.slot, _terms(), outer)
    assert paused.outcome is Outcome.PAUSED
    now[0] += 5_000
    store.unpause("api", 1_000)
    claimed_after = store.claim_nested(
        TaskCopy("api:a", "t1", 0), 1_000, granted.slot, _terms(), outer
    )
    assert claimed_after.outcome is Outcome.OK


def test_a_slow_inner_bucket_does_not_hold_up_a_fast_one() -> None:
    """A ticket its own bucket puts far past the outer's next free slot reserves nothing in
    the outer's grants: the other bucket's tickets take the outer's slots before it."""
    now = [T0_US]
    store = _store(now)
    outer = Outer("api", 10_000)
    store.take_nested(TaskCopy("slow", "t1", 0), Pace(1_000_000), _terms(), outer)
    far = store.grant_nested(TaskCopy("slow", "t2", 0), Pace(1_000_000), outer)
    assert far.delay_us == 1_000_000
    fast = [store.grant_nested(TaskCopy("fast", f"t{i}", 0), Pace(1_000), outer) for i in range(3)]
    assert [g.delay_us for g in fast] == [10_000, 20_000, 30_000]


def test_a_reset_outer_counts_its_burst_as_used() -> None:
    """The outer's record lost (here: reset) may have spent its burst: its new epoch counts
    the burst as used at the reset, so the inner buckets get one start per outer interval."""
    now = [T0_US]
    store = _store(now)
    outer = Outer("api", 10_000, burst=4)
    starts = []
    for i, tenant in enumerate(["a", "b", "c", "d"]):
        _, claimed = store.take_nested(TaskCopy(tenant, "t1", 0), Pace(1_000), _terms(ML), outer)
        assert claimed is not None and claimed.outcome is Outcome.OK, i
        starts.append(claimed.now_us + claimed.delay_us)
    assert starts == [T0_US] * 4, "an idle outer: its whole burst at once"
    now[0] += 100_000
    store.reset("api")
    admitted = []
    for tenant in ("e", "f"):
        granted, claimed = store.take_nested(
            TaskCopy(tenant, "t1", 0), Pace(1_000), _terms(ML), outer
        )
        assert claimed is None or claimed.outcome is Outcome.OK
        admitted.append(granted.delay_us)
    assert admitted == [ML + 10_000, ML + 20_000]


@dataclass
class _Inner:
    """One inner bucket of the simulation: its rules and its backlog's starts."""

    name: str
    interval_us: int
    burst: int
    limits: Limits
    costs: list[int]
    next_task: int = 0
    #: (real start, cost, granted slot) in the order admitted.
    starts: list[tuple[int, int, int]] = field(default_factory=list)


_limit_sets = st.sampled_from([(), (), (Limit(30_000, 2),), (Limit(7_000), Limit(45_000, 3))])


@st.composite
def _inners(draw: st.DrawFn) -> list[_Inner]:
    count = draw(st.integers(1, 4))
    return [
        _Inner(
            f"acct:t{i}",
            draw(st.sampled_from([1_000, 5_000, 12_000, 50_000])),
            draw(st.sampled_from([1, 1, 2, 3])),
            draw(_limit_sets),
            draw(st.lists(st.sampled_from([1, 1, 1, 2]), min_size=3, max_size=12)),
        )
        for i in range(count)
    ]


@settings(max_examples=150, deadline=None)
@given(
    inners=_inners(),
    outer_us=st.sampled_from([1_000, 4_000, 10_000, 20_000]),
    outer_burst=st.sampled_from([1, 1, 2, 5]),
    outer_limits=_limit_sets,
    ahead=st.integers(1, 3),
    lead_us=st.sampled_from([0, 500, ML]),
    handoff_us=st.sampled_from([0, 300]),
    lateness_us=st.lists(st.sampled_from([0, 0, 0, 1, 700, 9_000]), min_size=1, max_size=7),
    pause=st.one_of(st.none(), st.tuples(st.integers(0, 200_000), st.integers(1, 80_000))),
    reset_at_us=st.one_of(st.none(), st.integers(0, 300_000)),
    born_old=st.booleans(),
)
def test_random_nested_takes_keep_every_limit(
    inners: list[_Inner],
    outer_us: int,
    outer_burst: int,
    outer_limits: Limits,
    ahead: int,
    lead_us: int,
    handoff_us: int,
    lateness_us: list[int],
    pause: tuple[int, int] | None,
    reset_at_us: int | None,
    born_old: bool,
) -> None:
    """Backlogs in random inner buckets, each holding up to ``ahead`` tickets at once and
    claiming at its slot (less the lead) or late, through a pause and a reset of the outer:
    every window of all starts keeps the outer's budget and each of its limits; each inner
    bucket's starts keep its own budget and limits, in its tickets' order (their slots never
    go back; tickets of one slot, a burst's, may start in any order)."""
    outer = Outer("acct", outer_us, outer_burst, outer_limits)
    for inner in inners:  # a cost above any burst is refused by the configuration
        bursts = [inner.burst, outer_burst, *(b.burst for b in (*inner.limits, *outer_limits))]
        inner.costs = [min(cost, *bursts) for cost in inner.costs]
    now = [T0_US]
    store = _store(now, old=born_old)
    events: list[tuple[int, int, str, int, int, int, int]] = []  # time, seq, kind, inner, ...
    seq = [0]

    def push(
        at_us: int, kind: str, index: int, task: int = 0, epoch: int = 0, slot: int = 0
    ) -> None:
        seq[0] += 1
        heapq.heappush(events, (at_us, seq[0], kind, index, task, epoch, slot))

    def admit(index: int, claimed_now_us: int, delay_us: int, cost: int, slot_us: int) -> None:
        inners[index].starts.append((claimed_now_us + delay_us, cost, slot_us))
        push(claimed_now_us + delay_us, "next", index)

    def late() -> int:
        return lateness_us[seq[0] % len(lateness_us)]

    for index, inner in enumerate(inners):
        for _ in range(min(ahead, len(inner.costs))):
            push(T0_US, "next", index)
    if pause is not None:
        push(T0_US + pause[0], "pause", 0)
        push(T0_US + pause[0] + pause[1], "unpause", 0)
    if reset_at_us is not None:
        push(T0_US + reset_at_us, "reset", 0)
    while events:
        at_us, _, kind, index, task, epoch, slot_us = heapq.heappop(events)
        now[0] = max(now[0], at_us)
        if kind in ("pause", "unpause", "reset"):
            if kind == "reset":
                store.reset("acct")
            else:
                getattr(store, kind)("acct", outer_us)
            continue
        inner = inners[index]
        if kind == "next":
            if inner.next_task >= len(inner.costs):
                continue
            task, inner.next_task = inner.next_task, inner.next_task + 1
            kind = "take"
        cost = inner.costs[task]
        copy = TaskCopy(inner.name, f"t{task}", 0)
        terms = ClaimTerms(
            "w1", LEASE_US, lead_us, handoff_us, burst=inner.burst, cost=cost, limits=inner.limits
        )
        pace = Pace(inner.interval_us, 0, inner.burst, cost, limits=inner.limits)
        if kind == "take":
            granted, claimed = store.take_nested(copy, pace, terms, outer)
            assert granted.outcome is Outcome.OK
            epoch, slot_us = granted.epoch, granted.slot_us
            if claimed is None:
                push(now[0] + max(0, granted.delay_us - lead_us) + late(), "claim", index, task,
                     epoch, slot_us)  # fmt: skip
                continue
        else:
            claimed = store.claim_nested(
                copy, inner.interval_us, Slot(epoch, slot_us), terms, outer
            )
        if claimed.outcome is Outcome.OK:
            admit(index, claimed.now_us, claimed.delay_us, cost, slot_us)
        elif claimed.outcome in (Outcome.WAIT, Outcome.PAUSED):
            wait_us = claimed.delay_us if claimed.outcome is Outcome.WAIT else 1_000
            push(now[0] + max(1, wait_us - lead_us), "claim", index, task, epoch, slot_us)
        else:
            assert claimed.outcome is Outcome.RETICKET, claimed
            push(now[0], "take", index, task)
    everything = sorted((start, cost) for inner in inners for start, cost, _ in inner.starts)
    assert len(everything) == sum(len(inner.costs) for inner in inners), "every task started"
    assert_windows(everything, outer_burst, outer_us)
    for limit in outer_limits:
        assert_windows(everything, limit.burst, limit.interval_us)
    for inner in inners:
        own = sorted((start, cost) for start, cost, _ in inner.starts)
        assert_windows(own, inner.burst, inner.interval_us)
        for limit in inner.limits:
            assert_windows(own, limit.burst, limit.interval_us)
        in_time = [slot_us for _, _, slot_us in sorted(inner.starts, key=lambda s: s[0])]
        assert in_time == sorted(in_time), f"{inner.name}'s starts out of its tickets' order"
