"""Burst and cost in the pure model: tables, and the window property over random sequences."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_interval.schedule import ClaimTerms, Limit, Outcome, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.memory import MemoryStore
from tests.helpers.schedule_checks import assert_window_property, check_sequence
from tests.helpers.schedule_model import (
    HOLDERS,
    IDLE_US,
    ML,
    OLD_BORN_US,
    STARTS,
    TASKS,
    Model,
    Step,
    at,
    claim,
    grant,
    set_interval,
    throttle,
)


def run(steps: list[Step], burst: int, costs: dict[str, int] | None = None, **kw: Any) -> Any:
    return Model(burst=burst, costs=costs or {}, **kw).run(steps)


BURST_TABLE = [
    (
        "after an idle spell three start back to back, then one per interval",
        3, {}, OLD_BORN_US,
        [at(0), grant("a"), grant("b"), grant("c"), grant("d"), grant("e"), claim("a"),
         claim("b"), claim("c"), claim("d"), at(1_000), claim("d"), at(1_999), claim("e"),
         at(2_000), claim("e"), STARTS],
        [("OK", 1, 0, 0), ("OK", 2, 0, 0), ("OK", 3, 0, 0), ("OK", 4, 1_000, 1_000),
         ("OK", 5, 2_000, 2_000), ("OK", 0), ("OK", 0), ("OK", 0), ("WAIT", 1_000), ("OK", 0),
         ("WAIT", 1), ("OK", 0), ("starts", 0, 0, 0, 1_000, 2_000)],
    ),
    (
        "weighted costs use the budget: 3 + 3 + 1 units of a burst of 5",
        5, {"a": 3, "b": 3}, OLD_BORN_US,
        [at(0), grant("a"), grant("b"), grant("c"), claim("a"), claim("b"), at(1_000),
         claim("b"), at(2_000), claim("c"), STARTS],
        [("OK", 1, 0, 0), ("OK", 2, 1_000, 1_000), ("OK", 3, 2_000, 2_000), ("OK", 0),
         ("WAIT", 1_000), ("OK", 0), ("OK", 0), ("starts", 0, 1_000, 2_000)],
    ),
    (
        "the budget refills one unit per interval",
        3, {}, OLD_BORN_US,
        [at(0), grant("a"), grant("b"), grant("c"), claim("a"), claim("b"), claim("c"),
         at(1_500), grant("d"), grant("e"), claim("d"), claim("e"), at(2_000), claim("e")],
        [("OK", 1, 0, 0), ("OK", 2, 0, 0), ("OK", 3, 0, 0), ("OK", 0), ("OK", 0), ("OK", 0),
         ("OK", 4, 1_500, 0), ("OK", 5, 2_000, 500), ("OK", 0), ("WAIT", 500), ("OK", 0)],
    ),
    (
        "claims out of ticket order: the starts' budget holds all the same",
        2, {}, OLD_BORN_US,
        [at(0), grant("a"), grant("b"), grant("c"), claim("c"), claim("b"), claim("a")],
        [("OK", 1, 0, 0), ("OK", 2, 0, 0), ("OK", 3, 1_000, 1_000), ("WAIT", 1_000),
         ("OK", 0), ("OK", 0)],
    ),
    (
        "a throttle empties the burst: the throttled copy, then one per interval",
        3, {}, OLD_BORN_US,
        [at(0), grant("a"), claim("a"), at(5_000), throttle("a", 0), grant("d"), grant("e"),
         claim("a"), claim("d"), at(6_000), claim("d"), STARTS],
        [("OK", 1, 0, 0), ("OK", 0), ("throttled", 3_000), ("OK", 2, 2_000, 1_000),
         ("OK", 3, 3_000, 2_000), ("OK", 0), ("WAIT", 1_000), ("OK", 0),
         ("starts", 0, 5_000, 6_000)],
    ),
    (
        "a new epoch after state loss counts the burst as used when it lost it",
        3, {}, None,
        [at(0), grant("a"), grant("b"), at(ML + 1_000), claim("a"), claim("b"),
         at(ML + 2_000), claim("b")],
        [("OK", 1, ML + 1_000, ML + 1_000), ("OK", 2, ML + 2_000, ML + 2_000), ("OK", 0),
         ("WAIT", 1_000), ("OK", 0)],
    ),
    (
        "a longer interval keeps the used burst in units: no burst from slowing down",
        3, {}, OLD_BORN_US,
        [at(0), grant("a"), grant("b"), grant("c"), claim("a"), claim("b"), claim("c"),
         set_interval(2_000), grant("d"), claim("d"), at(2_000), claim("d")],
        [("OK", 1, 0, 0), ("OK", 2, 0, 0), ("OK", 3, 0, 0), ("OK", 0), ("OK", 0), ("OK", 0),
         ("OK", 4, 0, 0), ("WAIT", 2_000), ("OK", 0)],
    ),
    (
        "a countdown keeps the tickets after it in order, burst or not",
        3, {}, OLD_BORN_US,
        [at(0), grant("a", 5_000), grant("b"), grant("c")],
        [("OK", 1, 5_000, 5_000), ("OK", 2, 5_000, 5_000), ("OK", 3, 5_000, 5_000)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "burst", "costs", "born_us", "steps", "expected"),
    BURST_TABLE,
    ids=[t[0] for t in BURST_TABLE],
)
def test_burst(
    name: str,
    burst: int,
    costs: dict[str, int],
    born_us: int | None,
    steps: list[Step],
    expected: list[Any],
) -> None:
    assert run(steps, burst, costs, born_us=born_us) == expected


def test_a_burst_of_one_is_the_plain_slot_model() -> None:
    """burst = cost = 1 leaves no trace in the record: every start's extra stays 0."""
    m = Model(burst=1, born_us=OLD_BORN_US)
    m.run([at(0), grant("a"), grant("b"), claim("a"), at(1_000), claim("b")])
    assert m.state is not None and m.state.start_extra_us == 0
    assert m.state.lost_start_us is None


_grants = st.tuples(
    st.just("grant"), st.sampled_from(TASKS), st.integers(0, 1), st.sampled_from([0, 0, 500, 2_500])
)
_claims_due = st.tuples(
    st.just("claim_due"),
    st.sampled_from(HOLDERS),
    st.sampled_from([0, 50, ML]),
    st.sampled_from([500, 5_000]),
    st.sampled_from([-1, 0, 1]),
)
#: Mostly a grant and its claim as it comes due (a start), with the operations that keep the
#: interval as configured (the property is per interval).
_others = st.one_of(
    st.tuples(
        st.just("claim"),
        st.sampled_from(TASKS),
        st.integers(0, 1),
        st.sampled_from(HOLDERS),
        st.sampled_from([0, 400, ML]),
        st.sampled_from([500, 5_000]),
    ),
    st.tuples(st.just("advance"), st.integers(0, 3_000)),
    st.tuples(st.just("advance"), st.integers(0, 30)),
    st.tuples(
        st.just("throttle"),
        st.sampled_from(TASKS),
        st.integers(0, 1),
        st.sampled_from([0, 500, 5_000]),
        st.just(None),
    ),
    st.tuples(
        st.just("renew"),
        st.sampled_from(TASKS),
        st.integers(0, 1),
        st.sampled_from(HOLDERS),
        st.sampled_from([0, 500]),
    ),
    st.tuples(st.just("done"), st.sampled_from(TASKS), st.integers(0, 1), st.just(1_000)),
    st.sampled_from([("pause",), ("unpause",), ("lose",), ("lose_state",), ("expire",)]),
    st.tuples(st.just("advance_to_expiry"), st.sampled_from([-1, 0, 1])),
    st.tuples(st.just("advance"), st.integers(IDLE_US, IDLE_US + 3_000)),
)
burst_ops: st.SearchStrategy[list[Step]] = st.lists(
    st.one_of(
        st.tuples(_grants, _claims_due),
        st.tuples(_grants, _grants, _claims_due, _claims_due),
        st.tuples(_grants, _others),
        st.tuples(_others),
    ),
    max_size=40,
).map(lambda groups: [step for group in groups for step in group])


@settings(max_examples=400, deadline=None)
@given(
    burst_ops,
    st.sampled_from([1, 2, 3, 5]),
    st.lists(st.integers(1, 5), min_size=len(TASKS), max_size=len(TASKS)),
    st.lists(st.sampled_from([0, 0, 5, 300, ML]), min_size=len(HOLDERS), max_size=len(HOLDERS)),
    st.sampled_from([None, OLD_BORN_US]),
    st.lists(
        st.builds(Limit, st.sampled_from([300, 1_500, 2_500, 7_000]), st.sampled_from([1, 2, 4])),
        max_size=2,
    ),
)
def test_random_sequences_keep_the_budget(
    steps: list[Step],
    burst: int,
    costs: list[int],
    handoffs: list[int],
    born_us: int | None,
    limits: list[Limit],
) -> None:
    """Bursts, weighted costs, handoffs that differ per holder and extra limits: for every
    limit (the interval's and each extra one) and every window of starts Σ cost <= burst +
    span / interval, across throttles, pauses, expiry and state loss."""
    _check_budgets(steps, burst, costs, handoffs, born_us, limits, spacing=False)


def test_a_copy_throttled_earlier_does_not_start_inside_a_later_throttles_wait() -> None:
    """P9: task a is throttled and keeps a front slot; before its copy starts, task c's throttle
    shifts the slots so the next start comes after its wait, which leaves a's front slot before
    that wait's end. a's claim waits for it (found by the property test above: a's copy
    started 500 µs inside c's wait)."""
    steps: list[Step] = [
        ("throttle", "a", 0, 0, None),
        ("grant", "a", 0, 0),
        ("claim_due", "w1", 0, 500, -1),
        ("grant", "a", 0, 0),
        ("grant", "a", 1, 0),
        ("claim_due", "w1", 0, 500, -1),
        ("claim_due", "w1", 0, 500, -1),
        ("throttle", "c", 0, 500, None),
        ("grant", "a", 0, 0),
        ("claim_due", "w1", 0, 500, -1),
        ("advance", 600),
        ("claim", "a", 0, "w1", 0, 500),
    ]
    _check_budgets(steps, 2, [1, 1, 2, 1], [0, 0, 0], None, [], spacing=False)


def _check_budgets(
    steps: list[Step],
    burst: int,
    costs: list[int],
    handoffs: list[int],
    born_us: int | None,
    limits: list[Limit],
    *,
    spacing: bool,
) -> None:
    """Run ``steps`` (each task's cost at most the smallest burst) and check every limit's
    budget over every window of the starts that happened (``spacing``: P5 too)."""
    most = min([burst, *(limit.burst for limit in limits)])
    m = Model(
        burst=burst,
        costs={t: min(c, most) for t, c in zip(TASKS, costs, strict=True)},
        handoffs_us=dict(zip(HOLDERS, handoffs, strict=True)),
        born_us=born_us,
        limits=tuple(limits),
    )
    check_sequence(steps, m, spacing=spacing)
    assert_window_property(m, burst)
    for limit in limits:
        assert_window_property(m, limit.burst, limit.interval_us)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 3),
    st.sampled_from([2, 3, 5, 30]),
    st.sampled_from([0, 50, ML]),
    st.one_of(st.just(0), st.integers(0, 2 * ML)),
    st.sampled_from(["lose", "lose_state"]),
    st.integers(1, 3),
    st.sampled_from([0, 50, ML]),
)
def test_state_loss_right_after_a_burst_keeps_the_budget(
    before: int, burst: int, lead_us: int, lose_after_us: int, loss: str, after: int, lead2_us: int
) -> None:
    """A burst claimed ahead (lead), the store loses the state, a new epoch claims at once:
    the new epoch counts the burst as used when the state was lost (a burst of 30 intervals
    outlasts MAX_LEAD_US, and the tasks cost 1 and the whole burst)."""
    steps: list[Step] = []
    for task in TASKS[:before]:
        steps += [("grant", task, 0, 0), ("claim_due", "w1", lead_us, 5_000, 0)]
    steps += [("advance", lose_after_us), (loss,)]
    for task in TASKS[:after]:
        steps += [("grant", task, 1, 0), ("claim_due", "w2", lead2_us, 5_000, 0)]
    costs = {"a": burst, "c": burst}
    m = Model(burst=burst, costs=costs, born_us=OLD_BORN_US)
    check_sequence(steps, m, spacing=False)
    assert_window_property(m, burst)


#: Starts whose holders miss them: a claim as it comes due, time passing by up to a few
#: intervals, and the same claim again by its holder (a pool process late, a lost reply),
#: among other grants, claims, throttles and pauses.
_missed = st.lists(
    st.one_of(
        st.tuples(_grants, _claims_due),
        st.tuples(
            _grants,
            _claims_due,
            st.tuples(st.just("advance"), st.integers(0, 2_500)),
            st.tuples(st.just("claim_again"), st.sampled_from([0, 50, ML])),
        ),
        st.tuples(
            st.tuples(st.just("advance"), st.integers(0, 1_500)),
            st.tuples(st.just("claim_again"), st.sampled_from([0, ML])),
        ),
        st.tuples(_others),
    ),
    max_size=30,
).map(lambda groups: [step for group in groups for step in group])


@settings(max_examples=400, deadline=None)
@given(
    _missed,
    st.sampled_from([1, 1, 2, 3]),
    st.lists(st.integers(1, 3), min_size=len(TASKS), max_size=len(TASKS)),
    st.lists(st.sampled_from([0, 0, 5, 300, ML]), min_size=len(HOLDERS), max_size=len(HOLDERS)),
    st.lists(
        st.builds(Limit, st.sampled_from([300, 1_500, 2_500]), st.sampled_from([1, 2])),
        max_size=1,
    ),
)
def test_random_missed_starts_keep_the_budget(
    steps: list[Step], burst: int, costs: list[int], handoffs: list[int], limits: list[Limit]
) -> None:
    """A start its holder missed moves to now, or a new one comes after the last: it never
    happened, and the starts that did keep every limit's budget in every window (and, with no
    burst, the interval between each two)."""
    spacing = burst == 1 and not limits
    _check_budgets(steps, burst, costs, handoffs, OLD_BORN_US, limits, spacing=spacing)


def test_a_missed_start_with_a_start_admitted_since_does_not_move() -> None:
    """Burst 3: a's start is admitted at 0 and missed, b's at 0.2 T; the earliest start is then
    a's own again, but b came since: a's claim again is a new start, and the budget holds."""
    m = Model(burst=3, born_us=OLD_BORN_US)
    m.run([at(-ML), grant("a"), grant("b"), grant("c"), grant("d")])
    m.run([at(0), claim("a"), at(200), claim("b", "w2"), at(300), claim("a")])
    m.run([claim("c", "w3"), at(1_000), claim("d", "w2")])
    assert_window_property(m, 3)


def test_a_missed_start_moves_only_while_the_bucket_is_as_its_start_left_it() -> None:
    """A start admitted while the interval was 10 ms, missed; the interval then halved and an
    interactive start (ahead of the tickets) taken 5 ms later brings the starts' budget back
    where the missed start left it. That start came since: the claim again starts an interval
    after it, not at once."""
    now = [1_750_000_000_000_000]
    store = MemoryStore(clock_us=lambda: now[0])
    terms = ClaimTerms("h1", 10**9)
    granted = store.grant(TaskCopy("b", "t1", 0), Pace(10_000))
    now[0] += granted.delay_us
    first = store.claim(TaskCopy("b", "t1", 0), 10_000, granted.slot, terms)
    assert first.outcome is Outcome.OK
    missed_us = first.now_us + first.delay_us
    store.set_interval("b", 10_000, 5_000)
    now[0] = missed_us + 5_000
    front = store.grant(TaskCopy("b", "t2", 0), Pace(10_000, share=1.0))
    now[0] += front.delay_us
    other = store.claim(TaskCopy("b", "t2", 0), 10_000, front.slot, ClaimTerms("h2", 10**9))
    assert other.outcome is Outcome.OK
    other_us = other.now_us + other.delay_us
    now[0] += 100
    again = store.claim(TaskCopy("b", "t1", 0), 10_000, granted.slot, terms)
    start_us = again.now_us + again.delay_us if again.outcome is Outcome.OK else None
    assert again.outcome is Outcome.WAIT or (start_us is not None and start_us - other_us >= 5_000)
