"""The concurrency cap in the model: places taken by starts, freed by release or expiry."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from celery_interval import schedule
from celery_interval.schedule import (
    PLACE_POLL_US,
    PLACE_SETTLE_US,
    BucketState,
    ClaimTerms,
    Grant,
    Mark,
    Outcome,
    Pace,
    Place,
    Places,
    Slot,
)

I_US = 1_000
LEASE_US = 10_000_000
T0_US = 1_700_000_000_000_000


def _granted(state: BucketState | None, now_us: int) -> tuple[BucketState, Mark | None, Grant]:
    return schedule.grant(state, None, now_us, Pace(I_US), born_us=0)


def _claim(
    state: BucketState,
    mark: Mark | None,
    places: Places,
    now_us: int,
    slot: Slot,
    place: str,
    cap: int | None = 1,
    place_us: int | None = None,
) -> tuple[BucketState, Mark | None, Places, schedule.Claim]:
    terms = ClaimTerms("w", LEASE_US, cap=cap, place_us=place_us)
    return schedule.claim_capped(
        state, mark, places, now_us, I_US, slot, terms, place=place, born_us=0
    )


def test_a_full_bucket_waits_without_using_its_slot_and_starts_once_a_place_is_released() -> None:
    now = T0_US
    state, _, a = _granted(None, now)
    state, mark_b, b = _granted(state, now)
    now += b.delay_us
    state, _, places, ca = _claim(state, None, (), now, a.slot, "a:0")
    assert ca.outcome is Outcome.OK
    assert places == (Place(now + LEASE_US, "a:0"),)
    before = state
    now += I_US
    state, mark_b, places, cb = _claim(state, mark_b, places, now, b.slot, "b:0")
    assert (cb.outcome, cb.delay_us) == (Outcome.FULL, PLACE_POLL_US)
    assert state == before and isinstance(mark_b, schedule.Granted)
    places, released = schedule.release(places, "a:0", now + 10)
    assert released and places == ()
    state, _, places, cb = _claim(state, mark_b, places, now + 10, b.slot, "b:0")
    assert cb.outcome is Outcome.OK
    assert [p.holder for p in places] == ["b:0"]


def test_after_the_stores_birth_running_bodies_take_back_their_places_first() -> None:
    """A store born at T0 (a lost one: its places are gone, bodies may still run): a claim
    holding no place is FULL until PLACE_SETTLE_US after the birth; a running body's renewal
    takes its place back under the cap, never past it."""
    now = T0_US
    state, mark_a, a = _granted(None, now)
    now += a.delay_us
    terms = ClaimTerms("w", LEASE_US, cap=1)

    def claim_a(places: Places, at_us: int) -> tuple[Places, schedule.Claim]:
        _, _, places, claimed = schedule.claim_capped(
            state, mark_a, places, at_us, I_US, a.slot, terms, place="a:0", born_us=0,
            places_born_us=T0_US,
        )  # fmt: skip
        return places, claimed

    places, early = claim_a((), now)
    assert (early.outcome, early.delay_us) == (Outcome.FULL, T0_US + PLACE_SETTLE_US - now)
    places, taken = schedule.renew_place(places, "run:0", now, LEASE_US, cap=1)
    assert taken and [p.holder for p in places] == ["run:0"]
    places, taken = schedule.renew_place(places, "x:0", now, LEASE_US, cap=1)
    assert not taken and [p.holder for p in places] == ["run:0"], "never past the cap"
    places, again = schedule.renew_place(places, "x:0", now, LEASE_US)
    assert not again, "without a cap a lost place is not taken back"
    settled_us = T0_US + PLACE_SETTLE_US
    places, full = claim_a(places, settled_us)
    assert (full.outcome, full.delay_us) == (Outcome.FULL, PLACE_POLL_US)
    places, _ = schedule.release(places, "run:0", settled_us)
    places, ok = claim_a(places, settled_us)
    assert ok.outcome is Outcome.OK and [p.holder for p in places] == ["a:0"]


def test_a_place_of_a_dead_worker_comes_back_when_it_expires() -> None:
    now = T0_US
    state, _, a = _granted(None, now)
    state, mark_b, b = _granted(state, now)
    now += b.delay_us
    state, _, places, _ = _claim(state, None, (), now, a.slot, "a:0", place_us=30_000)
    waiting = _claim(state, mark_b, places, now + I_US, b.slot, "b:0", place_us=30_000)[3]
    assert (waiting.outcome, waiting.delay_us) == (Outcome.FULL, 30_000 - I_US)
    _, _, places, cb = _claim(state, mark_b, places, now + 30_000, b.slot, "b:0")
    assert cb.outcome is Outcome.OK and [p.holder for p in places] == ["b:0"]


def test_renewal_keeps_a_place_and_an_expired_one_is_not_renewed() -> None:
    places: Places = (Place(T0_US + 100, "a:0"),)
    places, renewed = schedule.renew_place(places, "a:0", T0_US + 50, 1_000)
    assert renewed and places == (Place(T0_US + 1_050, "a:0"),)
    places, renewed = schedule.renew_place(places, "a:0", T0_US + 1_050, 1_000)
    assert not renewed and places == ()
    assert schedule.release((), "a:0", T0_US) == ((), False)


def test_a_holder_claiming_again_keeps_its_place_and_no_cap_leaves_places_alone() -> None:
    now = T0_US
    state, _, a = _granted(None, now)
    now += a.delay_us
    terms = ClaimTerms("w", LEASE_US, lead_us=500, handoff_us=400, cap=1)
    state, mark, places, first = schedule.claim_capped(
        state, None, (), now, I_US, a.slot, terms, place="a:0", born_us=0
    )
    assert first.outcome is Outcome.OK and first.delay_us > 0
    _, _, places, again = _claim(state, mark, places, now + 1, a.slot, "a:0")
    assert again.outcome is Outcome.OK and [p.holder for p in places] == ["a:0"]
    stale = (Place(now - 5, "x:0"),)
    _, _, kept, _ = _claim(state, mark, stale, now + 1, a.slot, "a:0", cap=None)
    assert kept == stale


def test_take_of_a_due_slot_in_a_full_bucket_gets_its_ticket_and_waits() -> None:
    full = (Place(T0_US + LEASE_US, "a:0"),)
    terms = ClaimTerms("w", LEASE_US, cap=1)
    state, mark, places, granted, claimed = schedule.take_capped(
        None, None, full, T0_US, Pace(I_US), terms, place="b:0", born_us=0
    )
    assert granted.outcome is Outcome.OK and granted.delay_us == 0
    assert claimed is not None and claimed.outcome is Outcome.FULL
    assert places == full and state.last_start_us < T0_US and isinstance(mark, schedule.Granted)


ops = st.one_of(
    st.tuples(st.just("claim"), st.integers(0, 5), st.sampled_from([None, 2_000, 50_000])),
    st.tuples(st.just("release"), st.integers(0, 5), st.just(None)),
    st.tuples(st.just("renew"), st.integers(0, 5), st.sampled_from([0, 2_000, 50_000])),
    st.tuples(st.just("advance"), st.integers(0, 60_000), st.just(None)),
    st.tuples(st.just("lose"), st.just(0), st.just(None)),
)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 3), st.lists(ops, max_size=60))
def test_never_more_places_than_the_cap_and_starts_stay_spaced(
    cap: int, steps: list[tuple[str, int, int | None]]
) -> None:
    """At no instant more than ``cap`` live places; a new start only while one is free; starts
    of one epoch at least an interval apart; a state loss keeps the places."""
    now = T0_US
    state: BucketState | None = None
    marks: dict[int, Mark | None] = {}
    slots: dict[int, Slot] = {}
    places: Places = ()
    starts: dict[tuple[int, int], list[int]] = {}  # (losses, epoch) -> virtual starts, in order
    losses = 0  # a new state may have the lost one's epoch (both made at one instant)
    for op, body, arg in steps:
        name = f"t{body}:0"
        if op == "advance":
            now += body
        elif op == "lose":
            state, losses = None, losses + 1
        elif op == "release":
            places, _ = schedule.release(places, name, now)
        elif op == "renew":
            assert arg is not None
            places, _ = schedule.renew_place(places, name, now, arg)
        else:
            if body not in slots or state is None or slots[body].epoch != state.epoch:
                state, marks[body], g = schedule.grant(state, None, now, Pace(I_US), born_us=0)
                slots[body] = g.slot
            held = any(p.holder == name for p in schedule.live_places(places, now))
            others = len([p for p in schedule.live_places(places, now) if p.holder != name])
            before = marks.get(body)
            state, marks[body], places, c = _claim(
                state, before, places, now, slots[body], name, cap, arg
            )
            if c.outcome is Outcome.OK and not held:
                assert others < cap, "a start while every place was held"
            if c.outcome is Outcome.OK:
                v = schedule.virtual_now(state, now) + c.delay_us
                epoch = starts.setdefault((losses, state.epoch), [])
                lease = schedule.live(before, now)
                again = isinstance(lease, schedule.Lease) and lease.start_us == v
                if (
                    isinstance(lease, schedule.Lease)
                    and not again
                    and epoch[-1:] == [lease.start_us]
                ):
                    epoch.pop()  # its holder missed that start: it never happened
                if not again and epoch and v != epoch[-1]:
                    assert v - epoch[-1] >= I_US
                if not again:
                    epoch.append(max(v, epoch[-1]) if epoch else v)
        assert len(schedule.live_places(places, now)) <= cap


def test_the_lua_constants_are_the_models() -> None:
    """Every ``local NAME = value`` of lib.lua that names a constant of the model has its value
    (the differential test reaches some of them only over hours of simulated time)."""
    import re
    from importlib.resources import files

    lua = (files("celery_interval.stores") / "lua" / "lib.lua").read_text()
    found = dict(re.findall(r"^local ([A-Z_]+) = (\d+)$", lua, flags=re.MULTILINE))
    shared = {name: value for name, value in found.items() if hasattr(schedule, name)}
    assert {"MAX_LEAD_US", "PLACE_POLL_US", "PLACE_SETTLE_US", "ADAPT_STEPS"} <= set(shared)
    assert {name: int(v) for name, v in shared.items()} == {
        name: getattr(schedule, name) for name in shared
    }
