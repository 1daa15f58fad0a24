"""A discrete-event run of ``schedule.fair`` over one outer bucket: keys claim as their own
limits allow, the outer admits one start per interval, and each claim asks for its turn."""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from celery_interval.schedule.fair import FairShare, started, turn

#: The store's clock at the run's start (never 0: a ``want_until_us`` of 0 means not waiting).
T0_US = 1_000_000_000


@dataclass
class Key:
    """A key's work: ``tasks`` arriving at ``arrive_us`` (from the run's start), its own
    interval ``own_us`` (0: none) and weight; ``stop_us``: it stops claiming then."""

    weight: int = 1
    tasks: int = 10**9
    arrive_us: int = 0
    own_us: int = 0
    stop_us: int | None = None


@dataclass
class Run:
    starts: list[tuple[int, str]] = field(default_factory=list)
    #: Claims that asked for a turn (a store call each).
    claims: int = 0
    fair: FairShare = field(default_factory=FairShare)

    def counts(self, from_us: int = 0, to_us: int | None = None) -> Counter[str]:
        """Starts per key in ``[from_us, to_us)`` of the run."""
        end_us = T0_US + to_us if to_us is not None else None
        return Counter(
            k for t, k in self.starts if t >= T0_US + from_us and (end_us is None or t < end_us)
        )


def simulate(
    keys: dict[str, Key], spacing_us: int, until_us: int, latency_us: int = 0, lead_us: int = 0
) -> Run:
    """Each key's worker claims its next task ``lead_us`` before it may start and comes back
    ``latency_us`` after the wait it was told; the run ends at ``until_us``."""
    run = Run()
    last_us = -(10**12)
    left = {k: key.tasks for k, key in keys.items()}
    own_at = dict.fromkeys(keys, 0)
    events = [(T0_US + key.arrive_us, k) for k, key in keys.items()]
    heapq.heapify(events)
    while events:
        now_us, k = heapq.heappop(events)
        key = keys[k]
        if now_us > T0_US + until_us:
            break
        if left[k] <= 0 or (key.stop_us is not None and now_us >= T0_US + key.stop_us):
            continue
        if now_us + lead_us < own_at[k]:
            heapq.heappush(events, (own_at[k] - lead_us, k))
            continue
        earliest_us = last_us + spacing_us
        run.claims += 1
        run.fair, wait_us = turn(
            run.fair, k, key.weight, now_us, spacing_us, earliest_us - now_us, lead_us
        )
        if wait_us:
            heapq.heappush(events, (now_us + wait_us + latency_us, k))
            continue
        start_us = max(now_us, earliest_us, own_at[k])
        start_us = max(now_us, earliest_us, own_at[k])
        run.fair = started(run.fair, k, key.weight, 1, spacing_us, now_us, start_us + key.own_us)
        run.starts.append((start_us, k))
        last_us, left[k] = start_us, left[k] - 1
        own_at[k] = start_us + key.own_us
        heapq.heappush(events, (max(start_us + latency_us, own_at[k]) - lead_us, k))
    return run


def fluid_shares(
    keys: dict[str, Key], spacing_us: int, from_us: int, to_us: int
) -> dict[str, float]:
    """What each key would start in ``[from_us, to_us)`` under weighted fair sharing of one
    start per interval as a fluid (GPS: each interval divided among the keys with work left,
    by weight, a key never given more than it has left), from the run's start."""
    left = {k: float(key.tasks) for k, key in keys.items()}
    got = dict.fromkeys(keys, 0.0)
    for step_us in range(0, to_us, spacing_us):
        room = 1.0
        active = {k for k, key in keys.items() if key.arrive_us <= step_us and left[k] > 1e-9}
        while room > 1e-12 and active:
            weights = sum(keys[k].weight for k in active)
            given = {k: min(left[k], room * keys[k].weight / weights) for k in active}
            for k, share in given.items():
                left[k] -= share
                if step_us >= from_us:
                    got[k] += share
            room -= sum(given.values())
            active = {k for k in active if left[k] > 1e-9}
    return got


def simulate_nested(
    keys: dict[str, Key], outer_us: int, until_us: int, lead_us: int = 20_000
) -> Run:
    """The same run through the model's own steps: each key an inner bucket of an outer one
    (interval ``outer_us``), its worker granting its next task (``grant_nested``, shared)
    and claiming it (``claim_fair``) ``lead_us`` before its slot, again after each WAIT.
    Starts are the admitted ones, on the store's clock."""
    from celery_interval.schedule import ClaimTerms, Outcome, Pace
    from celery_interval.schedule.fair_claim import claim_fair
    from celery_interval.schedule.outer import Outer, grant_nested

    run = Run()
    inners: dict[str, Any] = dict.fromkeys(keys)
    marks: dict[tuple[str, int], Any] = {}
    outer_state = None
    left = {k: key.tasks for k, key in keys.items()}
    events = [(T0_US + key.arrive_us, k, "grant", None) for k, key in keys.items()]
    heapq.heapify(events)
    while events:
        now_us, k, kind, slot = heapq.heappop(events)
        key = keys[k]
        if now_us > T0_US + until_us:
            break
        task = key.tasks - left[k]
        pace = Pace(key.own_us or 1)
        outer = Outer("acct", outer_us, weight=key.weight)
        if kind == "grant":
            inners[k], marks[k, task], outer_state, granted = grant_nested(
                inners[k], marks.get((k, task)), outer_state, now_us, pace, outer,
                born_us=0, outer_born_us=0,
            )  # fmt: skip
            at_us = now_us + max(0, granted.delay_us - lead_us)
            heapq.heappush(events, (at_us, k, "claim", granted.slot))
            continue
        run.claims += 1
        terms = ClaimTerms(f"w/{k}", 30_000_000, lead_us)
        inners[k], marks[k, task], outer_state, run.fair, claimed = claim_fair(
            inners[k], marks.get((k, task)), outer_state, run.fair, now_us, slot, terms,
            outer, k, interval_us=pace.interval_us, born_us=0, outer_born_us=0,
        )  # fmt: skip
        if claimed.outcome is Outcome.WAIT:
            heapq.heappush(events, (now_us + max(1, claimed.delay_us), k, kind, slot))
            continue
        assert claimed.outcome is Outcome.OK, claimed
        run.starts.append((now_us + claimed.delay_us, k))
        left[k] -= 1
        if left[k] > 0:
            heapq.heappush(events, (now_us + claimed.delay_us, k, "grant", None))
    run.starts.sort()
    return run
