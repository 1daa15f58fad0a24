"""A fair outer bucket's claims: an inner bucket's start only in its turn of the fair share.

``claim_nested`` of a key (an inner bucket) of an outer bucket declared fair, asking
``schedule.fair.turn`` for the key's turn and moving its tag with ``schedule.fair.started``;
the outer's budget and the key's own limits are ``schedule.outer``'s, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from celery_interval.schedule import fair
from celery_interval.schedule.outer import (
    ClaimStep,
    Outer,
    both_records,
    claim_nested,
    is_new_start,
    moves_in_outer,
    outer_earliest,
    take_nested,
)
from celery_interval.schedule.pace import effective_interval
from celery_interval.schedule.state import (
    BucketState,
    Claim,
    ClaimTerms,
    Grant,
    Lease,
    Mark,
    Outcome,
    Pace,
    Slot,
    clamp_lead,
    live,
    virtual_now,
)

__all__ = ["claim_fair", "take_fair"]


def claim_fair(
    inner: BucketState | None,
    mark: Mark | None,
    outer_state: BucketState | None,
    share: fair.FairShare,
    now_us: int,
    slot: Slot,
    terms: ClaimTerms,
    outer: Outer,
    key: str,
    *,
    interval_us: int,
    born_us: int,
    outer_born_us: int,
    step: ClaimStep | None = None,
    refused: Callable[[bool], None] | None = None,
) -> tuple[BucketState, Mark | None, BucketState, fair.FairShare, Claim]:
    """``claim_nested`` of the inner bucket ``key`` (its weight ``outer.weight``) under the
    outer's fair share (``schedule.fair``): a claim that its own bucket admits, or that only
    the outer's budget holds back, asks for its turn; a start that is not yet its turn is not
    admitted (WAIT for the turn's estimate: neither record changes, the share notes the key
    waits), and an admitted one moves the key's tag. Returns (inner, mark, outer, share, claim).
    ``step`` may run twice (the second time: does the inner bucket alone admit the start?); a
    start it admitted that is not the key's turn calls ``refused``, for a store to undo what
    ``step`` wrote (the cap's places): True if the cap was checked (claim.lua drops expired
    places as it asks for the turn), False for a readmit, which asks for no turn."""
    weight = 1 if outer.weight is None else outer.weight
    inner, outer_state, _ = both_records(
        inner, outer_state, now_us, interval_us, outer, born_us, outer_born_us
    )
    after_inner, after, outer_after, claimed = claim_nested(
        inner, mark, outer_state, now_us, slot, terms, outer,
        interval_us=interval_us, born_us=born_us, outer_born_us=outer_born_us, step=step,
    )  # fmt: skip
    new_start = is_new_start(claimed, after, mark, now_us)
    # A readmit (its start passed unheard) asks no turn: it is charged unless it moved.
    readmit = isinstance(live(mark, now_us), Lease)
    if not new_start:
        if outer_state.paused_at_real_us is not None:
            return after_inner, after, outer_after, share, claimed
        alone = replace(outer, interval_us=1, burst=max(1, terms.cost), limits=(), weight=None)
        _, alone_after, _, alone_claimed = claim_nested(
            inner, mark, None, now_us, slot, terms, alone,
            interval_us=interval_us, born_us=born_us, outer_born_us=0, step=step,
        )  # fmt: skip
        if not is_new_start(alone_claimed, alone_after, mark, now_us):
            if readmit and refused is not None:
                refused(False)  # a FULL alone dropped expired places claim.lua never checked
            return after_inner, after, outer_after, share, claimed
    spacing_us = effective_interval(outer_state, outer.interval_us)
    wait_us = 0
    if not readmit:
        v_us = virtual_now(outer_state, now_us)
        free_in_us = outer_earliest(outer_state, outer, terms.cost) - v_us
        lead_us = clamp_lead(terms.lead_us)
        share, wait_us = fair.turn(share, key, weight, now_us, spacing_us, free_in_us, lead_us)
    if new_start and wait_us == 0:
        if not (readmit and moves_in_outer(outer_state, live(mark, now_us), terms.holder, outer)):
            own_us = max(1, terms.cost) * effective_interval(after_inner, interval_us)
            due_us = now_us + claimed.delay_us + own_us
            share = fair.started(share, key, weight, terms.cost, spacing_us, now_us, due_us)
        return after_inner, after, outer_after, share, claimed
    if refused is not None:
        refused(not readmit)
    if readmit:  # held back by the outer's budget
        return after_inner, after, outer_after, share, claimed
    wait_us = max(wait_us, claimed.delay_us if claimed.outcome is Outcome.WAIT else 0)
    waits = replace(claimed, outcome=Outcome.WAIT, epoch=inner.epoch, delay_us=wait_us)
    return inner, live(mark, now_us), outer_state, share, waits


def take_fair(
    inner: BucketState | None,
    mark: Mark | None,
    outer_state: BucketState | None,
    share: fair.FairShare,
    now_us: int,
    pace: Pace,
    terms: ClaimTerms,
    outer: Outer,
    key: str,
    *,
    born_us: int,
    outer_born_us: int,
    step: Callable[[Slot], ClaimStep] | None = None,
    refused: Callable[[bool], None] | None = None,
) -> tuple[BucketState, Mark | None, BucketState, fair.FairShare, Grant, Claim | None]:
    """``take_nested`` whose claim is ``claim_fair``'s. Returns (inner, mark, outer, share,
    grant, claim)."""
    shares = [share]

    def claim(
        inner: BucketState, mark: Mark | None, outer_state: BucketState, slot: Slot
    ) -> tuple[BucketState, Mark | None, BucketState, Claim]:
        inner, mark, outer_state, shares[0], claimed = claim_fair(
            inner, mark, outer_state, shares[0], now_us, slot, terms, outer, key,
            interval_us=pace.interval_us, born_us=born_us, outer_born_us=outer_born_us,
            step=None if step is None else step(slot), refused=refused,
        )  # fmt: skip
        return inner, mark, outer_state, claimed

    inner, mark, outer_state, granted, claimed = take_nested(
        inner, mark, outer_state, now_us, pace, terms, outer,
        born_us=born_us, outer_born_us=outer_born_us, step=step, claimer=claim,
    )  # fmt: skip
    return inner, mark, outer_state, shares[0], granted, claimed
