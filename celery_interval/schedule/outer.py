"""Nested buckets: an inner bucket's grants and starts also count in its outer bucket's budget.

A nested (inner) bucket, e.g. a tenant ``api:acme``, keeps its own record and rules (interval,
burst, limits, throttles, cap); each of its grants and starts also passes its outer bucket's
budget (``Outer``: e.g. the account ``api``), kept in the outer bucket's own record: the
outer's grants' and starts' GCRAs (``schedule.burst``) and its extra limits
(``schedule.limits``). One step reads and writes both records, so a refusal by either changes
neither, and every start is counted in both: for every window of starts of all inner buckets
together, Σ cost <= B + span / T of the outer (and of each of its limits), while each inner
bucket keeps its own interval and its tickets' order.

The two records have their own virtual times (pauses, throttles); a time of one is the other's
plus ``virtual_now(outer) - virtual_now(inner)``. A paused outer bucket pauses every claim of
its inner buckets (PAUSED); its grants say ``paused``. A grant whose own bucket puts its slot
more than one outer interval past the outer's next free slot reserves nothing in the outer's
grants (a reservation there would leave the outer idle until it); its start is still counted
at its claim, which waits for the outer's budget when another took it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from celery_interval.schedule import burst, core, fair, limits
from celery_interval.schedule.pace import effective_interval
from celery_interval.schedule.state import (
    BucketState,
    Claim,
    ClaimTerms,
    Grant,
    Lease,
    Limits,
    Mark,
    Outcome,
    Pace,
    Slot,
    Status,
    clamp_lead,
    live,
    new_state,
    virtual_now,
)

__all__ = [
    "Outer",
    "claim_fair",
    "claim_nested",
    "grant_nested",
    "status_nested",
    "take_fair",
    "take_nested",
]


@dataclass(frozen=True, slots=True)
class Outer:
    """The outer bucket whose budget an inner bucket's tasks also spend: its name, its
    configured interval (a ``set_interval`` override of the outer wins), burst and extra
    limits, and the inner bucket's weight in the outer's fair share (``claim_fair``; None:
    the outer's starts go to whichever claim fits first)."""

    bucket: str
    interval_us: int
    burst: int = 1
    limits: Limits = ()
    weight: int | None = None


#: A claim of the inner bucket under ``ClaimTerms`` (the cap's ``claim_capped`` in a store):
#: (state, mark, terms) → (state, mark, claim).
ClaimStep = Callable[
    [BucketState, "Mark | None", ClaimTerms], "tuple[BucketState, Mark | None, Claim]"
]
#: A take's claim of its granted slot: (inner, mark, outer, slot) → (inner, mark, outer, claim).
SlotClaim = Callable[
    [BucketState, "Mark | None", BucketState, Slot],
    "tuple[BucketState, Mark | None, BucketState, Claim]",
]


def _slot(state: BucketState, v_us: int, outer: Outer, cost: int) -> int:
    """The outer budget's earliest slot of ``cost`` at its virtual ``v_us`` (no ticket order:
    tickets of different inner buckets need none)."""
    spacing_us = effective_interval(state, outer.interval_us)
    tat_us = burst.grant_tat(state, spacing_us, outer.burst)
    slot_us = max(v_us, tat_us - burst.room(outer.burst, cost) * spacing_us)
    return limits.next_slot(state, outer.limits, cost, slot_us)


def _reserved(state: BucketState, slot_us: int, v_us: int, outer: Outer, cost: int) -> BucketState:
    """The outer's record after a ticket of ``cost`` at its ``slot_us``; unchanged when the
    slot is more than one interval past the budget's next free time."""
    spacing_us = effective_interval(state, outer.interval_us)
    tat_us = burst.grant_tat(state, spacing_us, outer.burst)
    if slot_us > max(tat_us, v_us) + spacing_us:
        return state
    state = limits.after_grant(state, slot_us, outer.limits, cost)
    return replace(state, tat_us=max(tat_us, slot_us) + max(1, cost) * spacing_us)


def _earliest(state: BucketState, outer: Outer, cost: int) -> int:
    """The earliest virtual time of the outer at which a start of ``cost`` conforms to it."""
    spacing_us = effective_interval(state, outer.interval_us)
    earliest_us = burst.earliest_start(state, spacing_us, outer.burst, cost)
    return limits.earliest_start(state, outer.limits, cost, earliest_us)


def _started(state: BucketState, start_us: int, outer: Outer, cost: int) -> BucketState:
    """The outer's record after a start of ``cost`` at its virtual ``start_us``."""
    spacing_us = effective_interval(state, outer.interval_us)
    state = limits.after_start(state, start_us, outer.limits, cost)
    return burst.after_start(state, start_us, spacing_us, outer.burst, cost)


def _both(
    inner: BucketState | None,
    outer_state: BucketState | None,
    now_us: int,
    interval_us: int,
    outer: Outer,
    born_us: int,
    outer_born_us: int,
) -> tuple[BucketState, BucketState, int]:
    """Both records (a missing one as its new epoch) and the outer's virtual time minus the
    inner's."""
    if inner is None:
        inner = new_state(now_us, interval_us, born_us)
    if outer_state is None:
        outer_state = new_state(now_us, outer.interval_us, outer_born_us)
    return inner, outer_state, virtual_now(outer_state, now_us) - virtual_now(inner, now_us)


def _paused(granted: Grant, outer_state: BucketState) -> Grant:
    """``granted``, ``paused`` also while the outer bucket is paused."""
    if outer_state.paused_at_real_us is None:
        return granted
    return replace(granted, paused=True)


def grant_nested(
    inner: BucketState | None,
    mark: Mark | None,
    outer_state: BucketState | None,
    now_us: int,
    pace: Pace,
    outer: Outer,
    *,
    born_us: int,
    outer_born_us: int,
) -> tuple[BucketState, Mark | None, BucketState, Grant]:
    """``grant`` of the inner bucket at the outer budget's next slot at the earliest; a new
    ticket reserves its slot in both (``_reserved``). Returns (inner, mark, outer, grant).
    An interactive share (``pace.share``) does not apply: the start takes a ticket in line.
    Under a fair share (``outer.weight``, ``claim_fair``) no slot is reserved in the outer's
    grants, in the order the grants came: the slot is no sooner than the outer's start
    budget allows, and the claims take turns."""
    pace = replace(pace, share=None)
    inner, outer_state, shift_us = _both(
        inner, outer_state, now_us, pace.interval_us, outer, born_us, outer_born_us
    )
    v = virtual_now(inner, now_us)
    if outer.weight is not None:
        floor_us = _earliest(outer_state, outer, pace.cost) - shift_us
        floored = replace(pace, not_before_in_us=max(pace.not_before_in_us, floor_us - v))
        inner, mark, granted = core.grant(inner, mark, now_us, floored, born_us=born_us)
        return inner, mark, outer_state, _paused(granted, outer_state)
    floor_us = _slot(outer_state, v + shift_us, outer, pace.cost) - shift_us
    floored = replace(pace, not_before_in_us=max(pace.not_before_in_us, floor_us - v))
    ticket = inner.ticket
    inner, mark, granted = core.grant(inner, mark, now_us, floored, born_us=born_us)
    if granted.outcome is Outcome.OK and granted.ticket > ticket:
        slot_us = granted.slot_us + shift_us
        outer_state = _reserved(outer_state, slot_us, v + shift_us, outer, pace.cost)
    return inner, mark, outer_state, _paused(granted, outer_state)


def claim_nested(
    inner: BucketState | None,
    mark: Mark | None,
    outer_state: BucketState | None,
    now_us: int,
    slot: Slot,
    terms: ClaimTerms,
    outer: Outer,
    *,
    interval_us: int,
    born_us: int,
    outer_born_us: int,
    step: ClaimStep | None = None,
) -> tuple[BucketState, Mark | None, BucketState, Claim]:
    """``claim`` of the inner bucket (``step``: with its cap) no sooner than the outer budget
    allows; a new start is counted in both. PAUSED while the outer is paused."""
    inner, outer_state, shift_us = _both(
        inner, outer_state, now_us, interval_us, outer, born_us, outer_born_us
    )
    mark = live(mark, now_us)
    if outer_state.paused_at_real_us is not None:
        return inner, mark, outer_state, Claim(Outcome.PAUSED, inner.epoch, 0, now_us)
    if step is None:

        def step(s: BucketState, m: Mark | None, t: ClaimTerms) -> tuple[
            BucketState, Mark | None, Claim
        ]:  # fmt: skip
            return core.claim(s, m, now_us, interval_us, slot, t, born_us=born_us)

    v = virtual_now(inner, now_us)
    floor_us = _earliest(outer_state, outer, terms.cost) - shift_us
    outer_spacing_us = effective_interval(outer_state, outer.interval_us)
    terms = replace(terms, not_before_us=floor_us, outer_spacing_us=outer_spacing_us)
    inner, after, claimed = step(inner, mark, terms)
    if _new_start(claimed, after, mark, now_us):
        start_us = v + claimed.delay_us + shift_us
        outer_state = _started(outer_state, start_us, outer, terms.cost)
    return inner, after, outer_state, claimed


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
    refused: Callable[[], None] | None = None,
) -> tuple[BucketState, Mark | None, BucketState, fair.FairShare, Claim]:
    """``claim_nested`` of the inner bucket ``key`` (its weight ``outer.weight``) under the
    outer's fair share (``schedule.fair``): a claim that its own bucket admits, or that only
    the outer's budget holds back, asks for its turn; a start that is not yet its turn is not
    admitted (WAIT for the turn's estimate: neither record changes, the share notes the key
    waits), and an admitted one moves the key's tag. Returns (inner, mark, outer, share, claim).
    ``step`` may run twice on the same records (the second time to ask whether the inner
    bucket alone admits the start); a start it admitted that is not the key's turn calls
    ``refused``, for a store to undo what ``step`` wrote beside its result (the cap's places).
    """
    weight = 1 if outer.weight is None else outer.weight
    inner, outer_state, _ = _both(
        inner, outer_state, now_us, interval_us, outer, born_us, outer_born_us
    )
    after_inner, after, outer_after, claimed = claim_nested(
        inner, mark, outer_state, now_us, slot, terms, outer,
        interval_us=interval_us, born_us=born_us, outer_born_us=outer_born_us, step=step,
    )  # fmt: skip
    new_start = _new_start(claimed, after, mark, now_us)
    if not new_start:
        if outer_state.paused_at_real_us is not None:
            return after_inner, after, outer_after, share, claimed
        alone = replace(outer, interval_us=1, burst=max(1, terms.cost), limits=(), weight=None)
        _, alone_after, _, alone_claimed = claim_nested(
            inner, mark, None, now_us, slot, terms, alone,
            interval_us=interval_us, born_us=born_us, outer_born_us=0, step=step,
        )  # fmt: skip
        if not _new_start(alone_claimed, alone_after, mark, now_us):
            return after_inner, after, outer_after, share, claimed
    spacing_us = effective_interval(outer_state, outer.interval_us)
    # A readmit (this holder's start passed unheard) does not wait its turn: its key had
    # that start, and a pool process waits for this one. It is charged all the same.
    readmit = isinstance(live(mark, now_us), Lease)
    wait_us = 0
    if not readmit:
        free_in_us = _earliest(outer_state, outer, terms.cost) - virtual_now(outer_state, now_us)
        lead_us = clamp_lead(terms.lead_us)
        share, wait_us = fair.turn(share, key, weight, now_us, spacing_us, free_in_us, lead_us)
    if new_start and wait_us == 0:
        own_us = max(1, terms.cost) * effective_interval(after_inner, interval_us)
        due_us = now_us + claimed.delay_us + own_us
        share = fair.started(share, key, weight, terms.cost, spacing_us, now_us, due_us)
        return after_inner, after, outer_after, share, claimed
    if refused is not None:
        refused()
    if readmit:  # held back by the outer's budget
        return after_inner, after, outer_after, share, claimed
    wait_us = max(wait_us, claimed.delay_us if claimed.outcome is Outcome.WAIT else 0)
    waits = replace(claimed, outcome=Outcome.WAIT, epoch=inner.epoch, delay_us=wait_us)
    return inner, live(mark, now_us), outer_state, share, waits


def _new_start(claimed: Claim, after: Mark | None, before: Mark | None, now_us: int) -> bool:
    """Whether a claim admitted a new start (not a holder's claim again of its own)."""
    return (
        claimed.outcome is Outcome.OK and isinstance(after, Lease) and after != live(before, now_us)
    )


def take_nested(
    inner: BucketState | None,
    mark: Mark | None,
    outer_state: BucketState | None,
    now_us: int,
    pace: Pace,
    terms: ClaimTerms,
    outer: Outer,
    *,
    born_us: int,
    outer_born_us: int,
    step: Callable[[Slot], ClaimStep] | None = None,
    claimer: SlotClaim | None = None,
) -> tuple[BucketState, Mark | None, BucketState, Grant, Claim | None]:
    """``take`` of a nested bucket: ``grant_nested``, then ``claim_nested`` (or ``claimer``)
    in the same step when the slot is due within ``terms.lead_us`` and neither bucket is
    paused; HELD (no ticket) while another holder's lease is live. ``step`` makes the inner
    claim of a slot."""
    inner, outer_state, _ = _both(
        inner, outer_state, now_us, pace.interval_us, outer, born_us, outer_born_us
    )
    lease = live(mark, now_us)
    if isinstance(lease, Lease) and lease.holder != terms.holder:
        inner, mark, granted, _ = core.take(inner, mark, now_us, pace, terms, born_us=born_us)
        return inner, mark, outer_state, _paused(granted, outer_state), None
    inner, mark, outer_state, granted = grant_nested(
        inner, mark, outer_state, now_us, pace, outer, born_us=born_us, outer_born_us=outer_born_us
    )
    due = granted.delay_us <= clamp_lead(terms.lead_us)
    if granted.outcome is not Outcome.OK or granted.paused or not due:
        return inner, mark, outer_state, granted, None
    if claimer is not None:
        inner, mark, outer_state, claimed = claimer(inner, mark, outer_state, granted.slot)
        return inner, mark, outer_state, granted, claimed
    inner, mark, outer_state, claimed = claim_nested(
        inner,
        mark,
        outer_state,
        now_us,
        granted.slot,
        terms,
        outer,
        interval_us=pace.interval_us,
        born_us=born_us,
        outer_born_us=outer_born_us,
        step=None if step is None else step(granted.slot),
    )
    return inner, mark, outer_state, granted, claimed


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
    refused: Callable[[], None] | None = None,
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


def status_nested(inner: Status, outer_status: Status, outer: Outer) -> Status:
    """A nested bucket's status beside its outer bucket's (each read with its pace): paused
    while either is (``outer_paused`` says the outer is), its next slot the later of the two
    (a ticket's slot must fit both budgets); the units left stay the bucket's own."""
    return replace(
        inner,
        paused=inner.paused or outer_status.paused,
        next_slot_in_us=max(inner.next_slot_in_us, outer_status.next_slot_in_us),
        outer=outer.bucket,
        outer_paused=outer_status.paused,
    )
