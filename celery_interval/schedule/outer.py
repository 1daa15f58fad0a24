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

from celery_interval.schedule import burst, core, limits
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
    "both_records",
    "claim_nested",
    "grant_nested",
    "is_new_start",
    "moves_in_outer",
    "outer_earliest",
    "status_nested",
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


def outer_earliest(state: BucketState, outer: Outer, cost: int) -> int:
    """The earliest virtual time of the outer at which a start of ``cost`` conforms to it."""
    spacing_us = effective_interval(state, outer.interval_us)
    earliest_us = burst.earliest_start(state, spacing_us, outer.burst, cost)
    return limits.earliest_start(state, outer.limits, cost, earliest_us)


def _started(
    state: BucketState, start_us: int, outer: Outer, cost: int, *, moves: bool = False
) -> BucketState:
    """The outer's record after a start of ``cost`` at its virtual ``start_us`` (``moves``:
    its last start, which never happened, moved there; the extra limits count both)."""
    spacing_us = effective_interval(state, outer.interval_us)
    state = limits.after_start(state, start_us, outer.limits, cost)
    if moves:
        return burst.moved(state, start_us, spacing_us, outer.burst, cost)
    return burst.after_start(state, start_us, spacing_us, outer.burst, cost)


def moves_in_outer(state: BucketState, mark: Mark | None, holder: str, outer: Outer) -> bool:
    """Whether ``mark`` is ``holder``'s lease whose start the outer's record is exactly as
    that start's admission left it (no start of any inner bucket since, the interval the
    same): a readmit of that start moves it in the outer too (``schedule.burst.moved``)."""
    if not isinstance(mark, Lease) or mark.holder != holder or mark.outer_tat_us is None:
        return False
    spacing_us = effective_interval(state, outer.interval_us)
    return mark.outer_tat_us == burst.start_tat(state, spacing_us, outer.burst)


def both_records(
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
    inner, outer_state, shift_us = both_records(
        inner, outer_state, now_us, pace.interval_us, outer, born_us, outer_born_us
    )
    v = virtual_now(inner, now_us)
    if outer.weight is not None:
        floor_us = outer_earliest(outer_state, outer, pace.cost) - shift_us
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
    inner, outer_state, shift_us = both_records(
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
    moves = moves_in_outer(outer_state, mark, terms.holder, outer)
    if moves:  # the missed start's budget is the readmit's: only the extra limits count both
        earliest_us = outer_state.last_start_us
        floor_us = limits.earliest_start(outer_state, outer.limits, terms.cost, earliest_us)
    else:
        floor_us = outer_earliest(outer_state, outer, terms.cost)
    outer_spacing_us = effective_interval(outer_state, outer.interval_us)
    terms = replace(terms, not_before_us=floor_us - shift_us, outer_spacing_us=outer_spacing_us)
    inner, after, claimed = step(inner, mark, terms)
    if is_new_start(claimed, after, mark, now_us):
        start_us = v + claimed.delay_us + shift_us
        outer_state = _started(outer_state, start_us, outer, terms.cost, moves=moves)
        tat_us = burst.start_tat(outer_state, outer_spacing_us, outer.burst)
        after = replace(after, outer_tat_us=tat_us) if isinstance(after, Lease) else after
    return inner, after, outer_state, claimed


def is_new_start(claimed: Claim, after: Mark | None, before: Mark | None, now_us: int) -> bool:
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
    inner, outer_state, _ = both_records(
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
