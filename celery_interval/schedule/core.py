"""Tickets, slots and claims: grant, claim, take, done, renew, pause, unpause, status."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from celery_interval.schedule import front, limits
from celery_interval.schedule.burst import (
    after_grant,
    after_start,
    earliest_start,
    grant_tat,
    moved,
    next_slot,
    start_tat,
    units_left,
)
from celery_interval.schedule.pace import eased, effective_interval
from celery_interval.schedule.state import (
    GRANTED_TTL_US,
    IDLE_GRACE_US,
    BucketState,
    Claim,
    ClaimTerms,
    Done,
    Grant,
    Granted,
    Lease,
    Mark,
    Outcome,
    Pace,
    Places,
    Slot,
    Status,
    clamp_lead,
    live,
    new_state,
    virtual_now,
)


def grant(
    state: BucketState | None, mark: Mark | None, now_us: int, pace: Pace, *, born_us: int
) -> tuple[BucketState, Mark | None, Grant]:
    """Atomically take the next ticket and slot: the grants' GCRA's (``schedule.burst``; with
    no burst ``max(v, tat)``), or ``v + pace.not_before_in_us`` if later.

    Idempotent per (task_id, retries): a copy whose granted slot has not been passed by a
    later start gets that ticket and slot again, so redelivered copies waste no slot.

    A slot further than ``pace.not_after_in_us`` from now is not granted: WAIT, with that
    slot and its delay, takes no ticket and changes nothing. An interactive start
    (``pace.share``) may go ahead of the tickets, or WAIT for its share (``schedule.front``).
    """
    if state is None:
        state = new_state(now_us, pace.interval_us, born_us)
    mark = live(mark, now_us)
    v = virtual_now(state, now_us)
    paused = state.paused_at_real_us is not None
    if isinstance(mark, Done):
        return state, mark, Grant(Outcome.DUPLICATE, state.epoch, 0, 0, 0, paused)
    if (
        isinstance(mark, Granted)
        and mark.epoch == state.epoch
        and (mark.front or mark.slot_us >= state.current_slot_us)
    ):
        delay_us = max(0, mark.slot_us + (0 if mark.front else state.pushed_us) - v)
        again = Grant(Outcome.OK, state.epoch, mark.ticket, mark.slot_us, delay_us, paused)
        return state, mark, again
    spacing_us = effective_interval(state, pace.interval_us)
    unfolded = state  # a WAIT leaves the state as it was
    state = front.rebased(state)  # tickets carry ticket time (``schedule.front``)
    virtual = front.in_virtual_time(state)
    slot_us = _first_slot(virtual, v, spacing_us, pace)
    at_us, ahead, waits = front.ahead(state, v, spacing_us, pace, slot_us)
    slot_us = at_us if ahead else slot_us - state.pushed_us
    if waits or (pace.not_after_in_us is not None and at_us - v > pace.not_after_in_us):
        return unfolded, mark, Grant(Outcome.WAIT, state.epoch, 0, slot_us, at_us - v, paused)
    ticket = state.ticket + 1
    if ahead:
        state = replace(front.after_front(state, at_us, spacing_us, pace), ticket=ticket)
    else:
        virtual = limits.after_grant(virtual, at_us, pace.limits, pace.cost)
        virtual = after_grant(virtual, at_us, spacing_us, pace.burst, pace.cost)
        state = replace(front.in_ticket_time(virtual, state.pushed_us), ticket=ticket)
    if not isinstance(mark, Lease):
        expires_real_us = now_us + at_us - v + GRANTED_TTL_US
        mark = Granted(state.epoch, ticket, slot_us, expires_real_us, ahead)
    return state, mark, Grant(Outcome.OK, state.epoch, ticket, slot_us, at_us - v, paused)


def _first_slot(state: BucketState, v_us: int, spacing_us: int, pace: Pace) -> int:
    """The slot a grant of ``pace`` at virtual ``v_us`` gets: the grants' GCRA's, or
    ``v + pace.not_before_in_us`` if later, or later where an extra limit asks."""
    slot_us = max(
        next_slot(state, v_us, spacing_us, pace.burst, pace.cost),
        v_us + max(0, pace.not_before_in_us),
    )
    return limits.next_slot(state, pace.limits, pace.cost, slot_us)


def claim(
    state: BucketState | None,
    mark: Mark | None,
    now_us: int,
    interval_us: int,
    slot: Slot,
    terms: ClaimTerms,
    *,
    born_us: int,
) -> tuple[BucketState, Mark | None, Claim]:
    """Atomically decide whether the copy held by ``terms.holder`` may start now (see Outcome).

    A claim may come up to ``terms.lead_us`` before its start; the start is never sooner than
    ``terms.handoff_us`` (or one interval, its outer's if longer, if shorter) after the claim:
    the caller's time to hand the task to a pool process.
    """
    if state is None:
        state = new_state(now_us, interval_us, born_us)
    mark = live(mark, now_us)
    settled = _settled(state, mark, now_us, terms.holder)
    if settled is not None:
        return state, mark, settled
    spacing_us = effective_interval(state, interval_us)
    front = isinstance(mark, Granted) and mark.front and mark.epoch == state.epoch
    # A lease of this holder here has a start that never happened (see _settled).
    missed = mark if isinstance(mark, Lease) else None
    if missed is None and (
        slot.epoch != state.epoch or (slot.slot_us < state.current_slot_us and not front)
    ):
        return state, mark, Claim(Outcome.RETICKET, state.epoch, 0, now_us)
    moves = missed is not None and _as_its_start_left_it(state, missed, spacing_us, terms.burst)
    slot_us = slot.slot_us if missed is None else state.current_slot_us
    earliest_us = _earliest(state, terms, spacing_us, slot_us, front, missed, moves)
    v = virtual_now(state, now_us)
    if front and slot_us < (state.reserved_us or 0) and v > earliest_us:  # kept slot passed:
        earliest_us = max(earliest_us, (state.reserved_us or 0) + spacing_us)  # after later ones
    lead_us = clamp_lead(terms.lead_us)
    if v + lead_us < earliest_us:
        return state, mark, Claim(Outcome.WAIT, state.epoch, earliest_us - v, now_us)
    # The handoff is at most one interval (the outer's, if longer): a task that reaches its
    # process later than that cannot start exactly anyway, and a longer wait only idles it.
    reach_us = min(max(0, terms.handoff_us), lead_us, max(spacing_us, terms.outer_spacing_us))
    start_us = max(v + reach_us, earliest_us)
    state = limits.after_start(state, start_us, terms.limits, terms.cost)
    if moves:
        state = moved(state, start_us, spacing_us, terms.burst, terms.cost)
    else:
        state = after_start(state, start_us, spacing_us, terms.burst, terms.cost)
    state = replace(
        state,
        current_slot_us=state.current_slot_us if front else slot_us,
        reserved_us=None if front and slot_us >= (state.reserved_us or 0) else state.reserved_us,
    )
    if missed is not None:
        state = _pushed(
            state, start_us - missed.start_us if moves else max(1, terms.cost) * spacing_us
        )
    state = eased(state, interval_us)
    state = replace(state, admitted=state.admitted + 1)
    tat_us = start_tat(state, effective_interval(state, interval_us), terms.burst)
    lease = Lease(
        terms.holder, start_us, now_us + terms.lease_us, state.epoch, tat_us, state.admitted
    )
    return state, lease, Claim(Outcome.OK, state.epoch, start_us - v, now_us)


def _settled(state: BucketState, mark: Mark | None, now_us: int, holder: str) -> Claim | None:
    """A claim's answer that needs no start decided: the bucket is paused, the copy is done
    or leased by another holder, or this holder's admitted start is still ahead (and outside
    a throttle's wait). None: a start is decided (for this holder's lease: its start passed
    unheard, or a throttle moved it into its wait, so it never happened)."""
    if state.paused_at_real_us is not None:
        return Claim(Outcome.PAUSED, state.epoch, 0, now_us)
    if isinstance(mark, Done):
        return Claim(Outcome.DUPLICATE, state.epoch, 0, now_us)
    if not isinstance(mark, Lease):
        return None
    if mark.holder != holder:
        return Claim(Outcome.HELD, state.epoch, mark.expires_real_us - now_us, now_us)
    v = virtual_now(state, now_us)
    until_us = state.throttled_until_us
    if mark.start_us >= v and (until_us is None or mark.start_us >= until_us):
        return Claim(Outcome.OK, state.epoch, mark.start_us - v, now_us)
    return None


def _as_its_start_left_it(state: BucketState, missed: Lease, spacing_us: int, burst: int) -> bool:
    """Whether the bucket is exactly as ``missed``'s admission left it (same epoch, no start
    admitted since, the same starts' TAT: the interval did not grow): then the missed start
    moves to now. Else a new start is admitted after the last, as if that one had happened.
    Extra limits and an outer bucket count both starts either way."""
    return (missed.epoch, missed.admitted, missed.tat_us) == (
        state.epoch,
        state.admitted,
        start_tat(state, spacing_us, burst),
    )


def _earliest(
    state: BucketState,
    terms: ClaimTerms,
    spacing_us: int,
    slot_us: int,
    front: bool,
    missed: Lease | None,
    moves: bool,
) -> int:
    """The earliest start (virtual µs) a claim may be admitted for: the bucket's budget (or
    the missed start, if it moves), every extra limit, the outer bucket's ``not_before_us``, a
    reserved slot, the end of a throttle's wait, and (for a ticket) its slot, pushed by
    ``pushed_us`` unless a front grant."""
    primary_us = (
        missed.start_us
        if moves and missed is not None
        else earliest_start(state, spacing_us, terms.burst, terms.cost)
    )
    earliest_us = limits.earliest_start(state, terms.limits, terms.cost, primary_us)
    if terms.not_before_us is not None:
        earliest_us = max(earliest_us, terms.not_before_us)
    if state.reserved_us is not None and not front:
        earliest_us = max(earliest_us, state.reserved_us + spacing_us)
    if state.throttled_until_us is not None:
        # Never inside a throttle's wait: a copy throttled earlier keeps a front slot that a
        # later throttle's shift may have left before the wait's end.
        earliest_us = max(earliest_us, state.throttled_until_us)
    if missed is None:
        earliest_us = max(slot_us + (0 if front else state.pushed_us), earliest_us)
    return earliest_us


def _pushed(state: BucketState, by_us: int) -> BucketState:
    """After a start the holder missed was admitted again: the tickets still waiting are
    pushed back ``by_us`` (``schedule.front``), so none meets it at the same earliest start."""
    if state.last_slot_us is None or state.current_slot_us >= state.last_slot_us:
        return state
    return replace(state, pushed_us=state.pushed_us + max(0, by_us))


def take(
    state: BucketState | None,
    mark: Mark | None,
    now_us: int,
    pace: Pace,
    terms: ClaimTerms,
    *,
    born_us: int,
) -> tuple[BucketState, Mark | None, Grant, Claim | None]:
    """``grant``, then ``claim`` in the same step when the slot is due within ``terms.lead_us``
    and the bucket runs: a task whose turn is now takes its ticket and its start in one round
    trip.

    A copy whose task runs under another holder's live lease is HELD (``delay_us`` = the
    lease left) and takes no ticket: the slot of one would go unused.
    """

    def plain(
        s: BucketState, m: Mark | None, granted: Slot
    ) -> tuple[BucketState, Mark | None, Claim]:
        return claim(s, m, now_us, pace.interval_us, granted, terms, born_us=born_us)

    return _take(state, mark, now_us, pace, terms, born_us, plain)


#: The claim a ``take`` makes of its granted slot: (state, mark, slot) → (state, mark, claim).
_ClaimStep = Callable[[BucketState, "Mark | None", Slot], "tuple[BucketState, Mark | None, Claim]"]


def _take(
    state: BucketState | None,
    mark: Mark | None,
    now_us: int,
    pace: Pace,
    terms: ClaimTerms,
    born_us: int,
    claim_step: _ClaimStep,
) -> tuple[BucketState, Mark | None, Grant, Claim | None]:
    """``take``, its claim made by ``claim_step``."""
    lease = live(mark, now_us)
    if isinstance(lease, Lease) and lease.holder != terms.holder:
        if state is None:
            state = new_state(now_us, pace.interval_us, born_us)
        paused = state.paused_at_real_us is not None
        left_us = lease.expires_real_us - now_us
        return state, lease, Grant(Outcome.HELD, state.epoch, 0, 0, left_us, paused), None
    state, mark, granted = grant(state, mark, now_us, pace, born_us=born_us)
    due = granted.delay_us <= clamp_lead(terms.lead_us)
    if granted.outcome is not Outcome.OK or granted.paused or not due:
        return state, mark, granted, None
    state, mark, claimed = claim_step(state, mark, granted.slot)
    return state, mark, granted, claimed


def done(now_us: int, dedupe_ttl_us: int) -> Done:
    """The message was acknowledged: every later copy of (task_id, retries) is a duplicate."""
    return Done(now_us + dedupe_ttl_us)


def renew(mark: Mark | None, now_us: int, holder: str, lease_us: int) -> tuple[Mark | None, bool]:
    """Extend ``holder``'s live lease to ``now + lease_us``; False if it holds none
    (``lease_us=0`` ends the lease now: a requeued message's copy takes a new ticket at once)."""
    mark = live(mark, now_us)
    if isinstance(mark, Lease) and mark.holder == holder:
        return replace(mark, expires_real_us=now_us + lease_us), True
    return mark, False


def pause(state: BucketState | None, now_us: int, interval_us: int, *, born_us: int) -> BucketState:
    """Freeze virtual time; an unknown bucket gets a paused new epoch so later workers obey it."""
    if state is None:
        state = new_state(now_us, interval_us, born_us)
    if state.paused_at_real_us is not None:
        return state
    return replace(state, paused_at_real_us=now_us)


def unpause(
    state: BucketState | None, now_us: int, interval_us: int, *, born_us: int
) -> BucketState:
    """Resume: the pause's length joins the offset, shifting every granted slot by exactly it."""
    if state is None:
        return new_state(now_us, interval_us, born_us)
    if state.paused_at_real_us is None:
        return state
    return replace(
        state,
        offset_us=state.offset_us + now_us - state.paused_at_real_us,
        paused_at_real_us=None,
    )


def status(
    state: BucketState | None,
    now_us: int,
    interval_us: int,
    *,
    born_us: int,
    places: Places = (),
    pace: Pace | None = None,
) -> Status:
    """A read-only view; an unknown bucket reads as the new epoch it would get; ``running``
    counts the live ``places`` (a capped bucket's). With the bucket's ``pace`` (its burst and
    extra limits; cost 1), ``next_slot_in_us`` is when the slot a ticket would get now comes
    (a burst's budget need not be full again) and ``units_left`` each budget's units left;
    without it, the next slot is where the grants' budgets are all full again."""
    exists = state is not None
    if state is None:
        state = new_state(now_us, interval_us, born_us)
    v = virtual_now(state, now_us)
    view = front.in_virtual_time(state)  # the grants' times beside v (``schedule.front``)
    units: tuple[int, ...] = ()
    if pace is None:
        next_us = limits.next_grant_tat(view, view.tat_us)
    else:
        spacing_us = effective_interval(state, interval_us)
        next_us = _first_slot(view, v, spacing_us, replace(pace, cost=1, not_before_in_us=0))
        units = (
            units_left(grant_tat(view, spacing_us, pace.burst), v, spacing_us, pace.burst),
            *limits.units_left(view, pace.limits, v),
        )
    return Status(
        exists=exists,
        epoch=state.epoch,
        interval_us=effective_interval(state, interval_us),
        overridden=state.interval_override_us is not None,
        paused=state.paused_at_real_us is not None,
        ticket=state.ticket,
        next_slot_in_us=max(0, next_us - v),
        current_slot_us=state.current_slot_us,
        last_start_us=state.last_start_us,
        virtual_now_us=v,
        adapted=state.interval_override_us is None and state.adapted_us is not None,
        running=sum(1 for p in places if p.expires_real_us > now_us),
        units_left=units,
    )


def expires_in_us(state: BucketState, now_us: int, interval_us: int) -> int | None:
    """How long after a write at ``now_us`` the store may drop ``state``; None: keep it.

    Once virtual time has reached both ``tat`` and the starts' (``last_start + interval`` with
    no burst), a new state (under an old birth marker) gives every grant and claim the same
    delays: only the epoch and the ticket numbers differ, and the grace lets claims of the old
    epoch come late. A paused bucket, one with an interval override and an adapted one are
    kept: a new state would forget the pause, the override or what the throttles taught.
    """
    if (
        state.paused_at_real_us is not None
        or state.interval_override_us is not None
        or state.adapted_us is not None
    ):
        return None
    v = virtual_now(state, now_us)
    spacing_us = effective_interval(state, interval_us)
    settled_us = front.latest_tat(
        state, max(v, state.last_start_us + spacing_us + state.start_extra_us)
    )
    return settled_us - v + IDLE_GRACE_US
