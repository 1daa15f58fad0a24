"""The fair share model: an outer bucket's starts divided among waiting keys by weight."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from celery_interval.schedule.fair import FairShare, Tag, started, turn
from tests.helpers.fair_sim import T0_US, Key, fluid_shares, simulate, simulate_nested

SPACING_US = 20_000  # the shared limit: 50 starts a second
SECOND_US = 1_000_000


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def test_equal_keys_share_alike_and_the_limit_is_used_in_full() -> None:
    run = simulate({k: Key() for k in "abc"}, SPACING_US, 10 * SECOND_US, 3_000, 20_000)
    counts = run.counts()
    assert sum(counts.values()) >= 0.99 * 10 * SECOND_US / SPACING_US
    assert max(counts.values()) - min(counts.values()) <= 1
    assert [t for t, _ in run.starts] == sorted(t for t, _ in run.starts)
    assert min(_gaps([t for t, _ in run.starts])) >= SPACING_US, "the outer's interval holds"


def test_weights_divide_the_starts_in_proportion() -> None:
    keys = {"a": Key(weight=1), "b": Key(weight=2), "c": Key(weight=3)}
    counts = simulate(keys, SPACING_US, 12 * SECOND_US, 3_000, 20_000).counts()
    total = sum(counts.values())
    for k, key in keys.items():
        assert abs(counts[k] - total * key.weight / 6) <= 2, counts


def test_a_key_its_own_interval_holds_below_its_share_gets_all_it_wants() -> None:
    """Max-min: ``a`` wants 10 a second of a 50-a-second limit; the others split the rest."""
    keys = {"a": Key(own_us=100_000), "b": Key(), "c": Key()}
    counts = simulate(keys, SPACING_US, 10 * SECOND_US, 3_000, 20_000).counts()
    assert counts["a"] >= 0.98 * 100
    assert abs(counts["b"] - counts["c"]) <= 1
    assert sum(counts.values()) >= 0.99 * 500


def test_a_small_key_behind_a_flood_finishes_at_its_share() -> None:
    """20 tasks arriving at 5 s behind a flood that has had the limit to itself: half the
    limit each, so 20 starts in about 40 intervals, not behind the flood's backlog."""
    keys = {"flood": Key(), "small": Key(tasks=20, arrive_us=5 * SECOND_US)}
    run = simulate(keys, SPACING_US, 10 * SECOND_US, 3_000, 20_000)
    small = [t for t, k in run.starts if k == "small"]
    assert len(small) == 20
    alone_at_share_us = 20 * 2 * SPACING_US
    assert small[-1] - (T0_US + 5 * SECOND_US) <= 2 * alone_at_share_us
    assert sum(run.counts().values()) >= 0.99 * 500


def test_a_key_that_stops_claiming_holds_the_others_up_only_briefly() -> None:
    """Its worker died while it waited its turn: the budget is taken by the others once it
    has been free half an interval, and the key stops counting as waiting."""
    keys = {"a": Key(), "b": Key(), "gone": Key(stop_us=2 * SECOND_US)}
    run = simulate(keys, SPACING_US, 6 * SECOND_US, 3_000, 20_000)
    after = run.counts(2 * SECOND_US + 200_000, 6 * SECOND_US)
    assert after["gone"] == 0
    assert after["a"] + after["b"] >= 0.99 * (3.8 * SECOND_US / SPACING_US) - 1
    assert "gone" not in {t.key for t in run.fair.tags if t.want_until_us >= T0_US + 6 * SECOND_US}


def test_a_key_back_from_idle_keeps_no_credit() -> None:
    """``late`` had nothing to do for 5 s: it then shares alike, it does not catch up."""
    keys = {"busy": Key(), "late": Key(arrive_us=5 * SECOND_US)}
    counts = simulate(keys, SPACING_US, 7 * SECOND_US, 3_000, 20_000).counts(5 * SECOND_US)
    assert abs(counts["late"] - counts["busy"]) <= 2, counts


def test_fifty_small_keys_arriving_over_a_flood_each_get_their_share() -> None:
    """The benchmark's shape, in the model: a flood, 50 keys of 20 tasks arriving over 10 s,
    weights 1, 2 and 3. In every 2-second window, every key that waited the whole window got
    at least 0.9 of its weighted share of the starts, and the limit was used in full."""
    keys = {"flood": Key(weight=1)}
    keys |= {f"k{i}": Key(weight=1 + i % 3, tasks=20, arrive_us=i * 200_000) for i in range(50)}
    run = simulate(keys, SPACING_US, 20 * SECOND_US, 3_000, 20_000)
    window_us = 2 * SECOND_US
    starts = {k: [t - T0_US for t, kk in run.starts if kk == k] for k in keys}
    for from_us in range(0, 20 * SECOND_US, window_us):
        counts = run.counts(from_us, from_us + window_us)
        assert sum(counts.values()) >= 0.98 * window_us / SPACING_US
        fluid = fluid_shares(keys, SPACING_US, from_us, from_us + window_us)
        backlogged = [
            k
            for k, key in keys.items()
            if key.arrive_us <= from_us and starts[k] and starts[k][-1] >= from_us + window_us
        ]
        assert backlogged, from_us
        short = {k: (counts[k], fluid[k]) for k in backlogged if counts[k] < 0.9 * fluid[k] - 1}
        assert not short, (from_us, short)


@settings(max_examples=40, deadline=None)
@given(
    weights=st.lists(st.integers(1, 5), min_size=2, max_size=8),
    latency_us=st.integers(0, 15_000),
)
def test_random_weights_share_in_proportion_and_use_the_limit(
    weights: list[int], latency_us: int
) -> None:
    keys = {f"k{i}": Key(weight=w) for i, w in enumerate(weights)}
    run = simulate(keys, SPACING_US, 8 * SECOND_US, latency_us, 20_000)
    counts = run.counts(SECOND_US)
    total = sum(counts.values())
    assert total >= 0.98 * 7 * SECOND_US / SPACING_US
    normalized = [counts[k] / keys[k].weight for k in keys]
    assert jain(normalized) >= 0.98, counts


def test_a_turn_waits_for_the_keys_before_it_and_none_waits_for_a_key_gone() -> None:
    fair = FairShare(v_us=100, tags=(Tag("a", 100, T0_US + 50_000, 1),))
    fair, wait_us = turn(fair, "b", 1, T0_US, SPACING_US, 0)
    assert wait_us == 0, "b's start tag is a's: a tie goes to the one that claims"
    fair = started(fair, "b", 1, 1, SPACING_US, T0_US, T0_US + 1)
    fair, wait_us = turn(fair, "b", 1, T0_US + 1, SPACING_US, SPACING_US)
    assert wait_us == SPACING_US + SPACING_US * 7 // 8, "the budget's, then most of a's start"
    _, wait_us = turn(fair, "b", 1, T0_US + 60_000, SPACING_US, 0)
    assert wait_us == 0, "a stopped waiting"
    _, wait_us = turn(fair, "b", 1, T0_US + 2, SPACING_US, -SPACING_US // 2)
    assert wait_us == 0, "the budget was free half an interval: b takes it"


def test_a_key_told_to_wait_holds_no_budget_up_while_it_is_away() -> None:
    """``a`` was told to wait 35 ms for ``x``'s two starts before its tag, and ``x`` then ran
    out of work: ``b``, claiming when the budget is free, does not wait for ``a`` while ``a``
    is away; once ``a`` is back, its earlier tag goes first."""
    x = Tag("x", 0, T0_US + 10_000, 1, T0_US)
    fair = FairShare(
        v_us=0, tags=(x, Tag("a", 2 * SPACING_US, 0, 1), Tag("b", 3 * SPACING_US, 0, 1))
    )
    fair, wait_us = turn(fair, "a", 1, T0_US, SPACING_US, 0)
    assert wait_us == 2 * SPACING_US * 7 // 8
    back_us = T0_US + wait_us
    fair, wait_us = turn(fair, "b", 1, T0_US + SPACING_US, SPACING_US, 0)
    assert wait_us == 0, "a is not back before the budget is free: b takes it"
    fair = started(fair, "b", 1, 1, SPACING_US, T0_US + SPACING_US, T0_US + SPACING_US)
    _, wait_us = turn(fair, "b", 1, back_us, SPACING_US, 0)
    assert wait_us > 0, "a is back, its tag before b's"


def test_a_key_back_only_after_the_free_budget_holds_it_up_not_within_the_lead() -> None:
    """``slow`` (first in the fair share) may start again in 15 ms by its own interval; the
    budget is free now: ``b``'s claim, 20 ms of lead, takes it rather than leave it idle."""
    fair = FairShare(
        v_us=0,
        tags=(
            Tag("slow", 0, T0_US + 100_000, 1, T0_US + 15_000),
            Tag("b", SPACING_US, T0_US + 100_000, 1, T0_US),
        ),
    )
    _, wait_us = turn(fair, "b", 1, T0_US, SPACING_US, 0, 20_000)
    assert wait_us == 0
    _, wait_us = turn(fair, "b", 1, T0_US, SPACING_US, 16_000, 20_000)
    assert wait_us > 0, "the budget is free when slow is back: its turn"


def _gaps(times: list[int]) -> list[int]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_nested_claims_take_turns_and_every_limit_holds() -> None:
    """The model's own steps (``grant_nested`` shared, ``claim_fair``): the shares as above,
    the outer's interval exact between all starts, each key's own interval between its own."""
    keys = {
        "a": Key(weight=1),
        "b": Key(weight=2),
        "c": Key(weight=3),
        "slow": Key(weight=3, own_us=100_000),
    }
    run = simulate_nested(keys, SPACING_US, 10 * SECOND_US)
    counts = run.counts()
    assert min(_gaps([t for t, _ in run.starts])) >= SPACING_US
    assert min(_gaps([t for t, k in run.starts if k == "slow"])) >= 100_000
    assert counts["slow"] >= 0.98 * 100, "held below its share by its own interval: all of it"
    rest = sum(counts[k] for k in "abc")
    assert sum(counts.values()) >= 0.98 * 500
    for k in "abc":
        assert abs(counts[k] - rest * keys[k].weight / 6) <= 3, counts


def test_nested_small_key_behind_a_flood() -> None:
    keys = {"flood": Key(), "small": Key(tasks=20, arrive_us=5 * SECOND_US)}
    run = simulate_nested(keys, SPACING_US, 10 * SECOND_US)
    small = [t for t, k in run.starts if k == "small"]
    assert len(small) == 20 and small[-1] - (T0_US + 5 * SECOND_US) <= 2 * 20 * 2 * SPACING_US
    assert min(_gaps([t for t, _ in run.starts])) >= SPACING_US


def test_a_claim_again_of_an_admitted_start_takes_no_turn() -> None:
    """A holder's claim again of its admitted start (a lost reply) is answered OK as before,
    and the share does not count it twice."""
    from celery_interval.schedule import ClaimTerms, Outcome, Pace
    from celery_interval.schedule.fair_claim import claim_fair
    from celery_interval.schedule.outer import Outer, grant_nested

    outer = Outer("acct", SPACING_US, weight=1)
    inner, mark, outer_state, granted = grant_nested(
        None, None, None, T0_US, Pace(1), outer, born_us=0, outer_born_us=0
    )
    terms = ClaimTerms("w/1", 30_000_000, 20_000)
    steps = []
    share = FairShare()
    for _ in range(2):
        inner, mark, outer_state, share, claimed = claim_fair(
            inner, mark, outer_state, share, T0_US, granted.slot, terms, outer, "k",
            interval_us=1, born_us=0, outer_born_us=0,
        )  # fmt: skip
        steps.append((claimed.outcome, share))
    assert [o for o, _ in steps] == [Outcome.OK, Outcome.OK]
    assert steps[0][1] == steps[1][1], "the claim again moved no tag"


class _FairKeys:
    """Keys of one fair outer at 20 ms, each with one ticket due at T0, claimed step by step
    through ``claim_fair`` (a lead of 1 ms, shorter than the outer's waits)."""

    def __init__(self, *keys: str) -> None:
        from celery_interval.schedule import ClaimTerms, Pace
        from celery_interval.schedule.outer import Outer, grant_nested

        self.outer = Outer("acct", SPACING_US, weight=1)
        self.terms = ClaimTerms("w/1", 30_000_000, 1_000)
        self.share, self.outer_state = FairShare(), None
        self.records: dict[str, tuple[Any, Any, Any]] = {}
        for key in keys:
            inner, mark, self.outer_state, granted = grant_nested(
                None, None, self.outer_state, T0_US, Pace(1), self.outer,
                born_us=0, outer_born_us=0,
            )  # fmt: skip
            self.records[key] = (inner, mark, granted.slot)

    def claim(self, key: str, now_us: int) -> Any:
        from celery_interval.schedule.fair_claim import claim_fair

        inner, mark, slot = self.records[key]
        inner, mark, self.outer_state, self.share, claimed = claim_fair(
            inner, mark, self.outer_state, self.share, now_us, slot, self.terms, self.outer,
            key, interval_us=1, born_us=0, outer_born_us=0,
        )  # fmt: skip
        self.records[key] = (inner, mark, slot)
        return claimed

    def finish_us(self, key: str) -> int:
        return self.share.tag_of(key, 1).finish_us


def test_a_readmit_nothing_passed_moves_in_the_outer_too_and_takes_no_turn() -> None:
    """A holder whose admitted start passed unheard (its pool process came 5 ms late) claims
    again before any other start: the start moves to now in the outer too (no interval of
    the account lost), though another key waits for its turn, and is charged nothing more."""
    from celery_interval.schedule import Outcome

    keys = _FairKeys("k", "o")
    assert keys.claim("k", T0_US).outcome is Outcome.OK
    assert keys.claim("o", T0_US + 1_000).outcome is Outcome.WAIT
    charged_us = keys.finish_us("k")
    readmit = keys.claim("k", T0_US + 5_000)
    assert (readmit.outcome, readmit.delay_us) == (Outcome.OK, 0), readmit
    assert keys.finish_us("k") == charged_us
    after = keys.claim("o", T0_US + SPACING_US)
    assert (after.outcome, after.delay_us) == (Outcome.WAIT, 5_000), "the moved start's"


def test_a_readmit_after_another_start_takes_no_turn_and_is_charged() -> None:
    """Another key started after the missed start: the readmit takes the outer's next free
    budget, ahead of a key whose turn is earlier (its pool process waits), and is charged."""
    from celery_interval.schedule import Outcome

    keys = _FairKeys("k", "o", "p")
    assert keys.claim("k", T0_US).outcome is Outcome.OK
    assert keys.claim("o", T0_US + 1_000).outcome is Outcome.WAIT
    assert keys.claim("p", T0_US + 2_000).outcome is Outcome.WAIT
    assert keys.claim("o", T0_US + SPACING_US).outcome is Outcome.OK
    held_back = keys.claim("k", T0_US + SPACING_US + 5_000)
    assert (held_back.outcome, held_back.delay_us) == (Outcome.WAIT, 15_000), "the budget's"
    charged_us = keys.finish_us("k")
    assert charged_us > keys.finish_us("p"), "p's turn comes first"
    readmit = keys.claim("k", T0_US + 2 * SPACING_US)
    assert readmit.outcome is Outcome.OK, readmit
    assert keys.finish_us("k") == charged_us + SPACING_US


def test_a_keys_share_is_its_weight_among_the_waiting_keys() -> None:
    from celery_interval.shares import KeyShare, key_shares

    share = FairShare(
        5, (Tag("a", 9, T0_US + 10, 1), Tag("b", 7, T0_US + 10, 3), Tag("idle", 9, T0_US - 1, 2))
    )
    assert key_shares("acct", share, T0_US) == {
        "a": KeyShare("acct", 1, 0.25, True),
        "b": KeyShare("acct", 3, 0.75, True),
        "idle": KeyShare("acct", 2, 0.0, False),
    }
