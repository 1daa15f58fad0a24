"""A claim as the stores run it: the concurrency cap's places of running bodies (taken by a
claim, renewed, released), and the wait after a birth of the store that lost its done marks."""

from __future__ import annotations

from dataclasses import replace

from celery_interval.schedule.core import _take, claim
from celery_interval.schedule.state import (
    MARKS_SETTLE_US,
    PLACE_POLL_US,
    PLACE_SETTLE_US,
    BucketState,
    Claim,
    ClaimTerms,
    Grant,
    Mark,
    Outcome,
    Pace,
    Place,
    Places,
    Slot,
    live,
    new_state,
)


def live_places(places: Places, now_us: int) -> Places:
    """The places that have not expired at ``now_us``, ordered."""
    return tuple(sorted(p for p in places if p.expires_real_us > now_us))


def claim_capped(
    state: BucketState | None,
    mark: Mark | None,
    places: Places,
    now_us: int,
    interval_us: int,
    slot: Slot,
    terms: ClaimTerms,
    *,
    place: str,
    born_us: int,
    places_born_us: int | None = None,
    settle_until_us: int | None = None,
) -> tuple[BucketState, Mark | None, Places, Claim]:
    """``claim`` under the bucket's cap ``terms.cap`` (None: no cap, ``places`` untouched).

    A claim ``claim`` would admit starts only if the body ``place`` holds a live place or one
    is free: then it takes (or renews) it until ``now + place_us``. When all ``cap`` live
    places are held by others it is FULL (a wait without lead: the claim comes again when the
    first of them expires, but at most ``PLACE_POLL_US`` later, as a release is not announced),
    and nothing else changes: the slot is not used, the copy keeps its grant.

    ``places_born_us`` is when the store's records began (its birth marker; None: it keeps
    none, as on a Redis Cluster). A store that lost its records lost the places of bodies still
    running; each takes its place again at its next renewal (``renew_place``, at least every
    ``PLACE_RENEW_US``), so for ``PLACE_SETTLE_US`` after the birth a claim that holds no place
    is FULL until then. Until ``settle_until_us`` (``marks_settle_until_us``: the done
    marks' settle window after the store lost its state) a new start WAITs, before any FULL.
    Every answer carries the birth marker (``Claim.born_us``).
    """
    state_after, mark_after, claimed = claim(
        state, mark, now_us, interval_us, slot, terms, born_us=born_us
    )
    claimed = replace(claimed, born_us=places_born_us)
    if claimed.outcome is not Outcome.OK:
        return state_after, mark_after, places, claimed

    def unchanged(outcome: Outcome, wait_us: int) -> tuple[BucketState, Mark | None, Places, Claim]:
        """No start: the state as before (made if missing), the mark as it was, ``places``."""
        kept = new_state(now_us, interval_us, born_us) if state is None else state
        waits = Claim(outcome, kept.epoch, wait_us, now_us, places_born_us)
        return kept, live(mark, now_us), places, waits

    settling_us = 0 if settle_until_us is None else settle_until_us - now_us
    if settling_us > 0 and mark_after != live(mark, now_us):
        return unchanged(Outcome.WAIT, settling_us)
    if terms.cap is None:
        return state_after, mark_after, places, claimed
    place_us = terms.lease_us if terms.place_us is None else terms.place_us
    places = live_places(places, now_us)
    others = tuple(p for p in places if p.holder != place)
    settling_us = 0 if places_born_us is None else places_born_us + PLACE_SETTLE_US - now_us
    if len(others) == len(places) and (settling_us > 0 or len(places) >= terms.cap):
        if settling_us > 0:
            return unchanged(Outcome.FULL, settling_us)
        return unchanged(Outcome.FULL, min(places[0].expires_real_us - now_us, PLACE_POLL_US))
    taken = live_places((*others, Place(now_us + place_us, place)), now_us)
    return state_after, mark_after, taken, claimed


def marks_settle_until_us(
    knew_born_us: int | None,
    store_born_us: int | None,
    until_us: int | None,
    now_us: int,
    *,
    redelivered: bool = False,
) -> int | None:
    """The end of the done marks' settle window once a claimer that saw the store's birth
    ``knew_born_us`` comes (``until_us``: its end so far; None: none was opened).

    A store born (``store_born_us``, its birth marker) after a birth the claimer saw lost
    every done mark; each worker writes again those of the bodies that ran on it when its
    claim meets the new birth. So each such claimer's arrival holds every new start for
    ``MARKS_SETTLE_US`` from then: the window follows the workers as they come back, not the
    birth (a store born while the broker was down has no claimer for seconds). A claimer that
    saw no birth, or the store's own, or a store without a marker opens nothing, unless its
    message was ``redelivered`` (a body of it may have run, remembered only by a worker not
    back yet: a worker started since the loss knows no earlier birth) within
    ``MARKS_SETTLE_US`` of the birth: then the window lasts until that long after the birth,
    while the workers that stayed up write their marks again."""
    if store_born_us is None:
        return until_us
    if redelivered and now_us < store_born_us + MARKS_SETTLE_US:
        until_us = max(store_born_us + MARKS_SETTLE_US, until_us or 0)
    if knew_born_us is None or knew_born_us == store_born_us:
        return until_us
    return max(now_us + MARKS_SETTLE_US, until_us or 0)


def take_capped(
    state: BucketState | None,
    mark: Mark | None,
    places: Places,
    now_us: int,
    pace: Pace,
    terms: ClaimTerms,
    *,
    place: str,
    born_us: int,
    places_born_us: int | None = None,
    settle_until_us: int | None = None,
) -> tuple[BucketState, Mark | None, Places, Grant, Claim | None]:
    """``take`` whose claim is ``claim_capped``: a start needs its slot and a place."""
    kept = [places]

    def capped(
        s: BucketState, m: Mark | None, granted: Slot
    ) -> tuple[BucketState, Mark | None, Claim]:
        s, m, kept[0], claimed = claim_capped(
            s,
            m,
            places,
            now_us,
            pace.interval_us,
            granted,
            terms,
            place=place,
            born_us=born_us,
            places_born_us=places_born_us,
            settle_until_us=settle_until_us,
        )
        return s, m, claimed

    state, mark, granted, claimed = _take(state, mark, now_us, pace, terms, born_us, capped)
    return state, mark, kept[0], granted, claimed


def release(places: Places, place: str, now_us: int) -> tuple[Places, bool]:
    """The body ``place`` ended: its place is free at once; False if it held no live one."""
    live_now = live_places(places, now_us)
    kept = tuple(p for p in live_now if p.holder != place)
    return kept, len(kept) < len(live_now)


def renew_place(
    places: Places, place: str, now_us: int, place_us: int, cap: int | None = None
) -> tuple[Places, bool]:
    """Extend the live place of the body ``place`` to ``now + place_us``. A body that holds
    none (the store lost it, or it expired) takes one again while fewer than ``cap`` are live;
    False when it cannot (the body runs on, but its place is someone else's)."""
    kept, held = release(places, place, now_us)
    if not held and (cap is None or len(kept) >= cap):
        return kept, False
    return live_places((*kept, Place(now_us + place_us, place)), now_us), True
