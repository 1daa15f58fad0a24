"""Interactive starts: a share of a bucket's rate kept for ``slot()`` callers, ahead of the tickets.

A grant whose ``Pace.share`` is set (an inline start of a bucket with an interactive share) does
not queue behind the granted tickets: its slot is the earliest start the starts' budget allows
now (the claims' GCRA, the extra limits, after any reserved slot). It holds that slot as a
throttled copy holds its kept one: a ``front`` grant (a later start does not pass it, its claim
leaves ``current_slot_us`` alone) and the ``reserved`` slot (every other claim starts an interval
after it at the earliest).

The tickets it went ahead of are pushed back by its cost, in order: a ticket's slot is in
*ticket time*, virtual time minus ``BucketState.pushed_us``, which each front start grows by its
cost in intervals. A ticket due then claims an interval later (WAIT), as does every ticket after
it, so none passes another and none is re-ticketed; tickets granted later come after it too. The
grants' GCRA (``tat_us``, ``last_slot_us``) and the limits' grants' times live in ticket time;
a step that sets them beside the starts' times works in virtual time (``in_virtual_time``);
while no ticket waits, a grant first folds ``pushed_us`` back into them (``rebased``).

Interactive starts are themselves limited to ``share`` of the rate: their own GCRA (burst 1,
``BucketState.front_tat_us``) spaces them ``ceil(interval / share)`` per unit of cost. Where that
GCRA puts the front slot later than the budget would, the grant is a WAIT (no ticket taken, the
delay until it conforms): a slot reserved ahead would hold every task back until then. Where an
ordinary ticket's slot is no later than the front one (no backlog), the grant is an ordinary one
and spends nothing of the share.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from celery_interval.schedule import limits
from celery_interval.schedule.burst import after_grant, earliest_start
from celery_interval.schedule.state import BucketState, LimitTats, Pace


class Ahead(NamedTuple):
    """Where a grant's slot goes: ``slot_us``; ``front``: ahead of the tickets; ``waits``: the
    share's GCRA puts it later than the budget would (no grant yet)."""

    slot_us: int
    front: bool
    waits: bool


def share_spacing(spacing_us: int, share: float) -> int:
    """The interactive starts' interval: ``spacing_us / share``, rounded up (the same double
    division as the Lua)."""
    return max(1, math.ceil(spacing_us / share))


def ahead(state: BucketState, v_us: int, spacing_us: int, pace: Pace, ticket_us: int) -> Ahead:
    """Where a grant of ``pace`` goes at virtual ``v_us`` when a ticket's slot would be
    ``ticket_us`` in virtual time:
    the front (``pace.share`` set and the budget's earliest start before ``ticket_us``), else
    ``ticket_us``."""
    if pace.share is None:
        return Ahead(ticket_us, False, False)
    budget_us = max(
        v_us + max(0, pace.not_before_in_us),
        limits.earliest_start(
            state, pace.limits, pace.cost, earliest_start(state, spacing_us, pace.burst, pace.cost)
        ),
    )
    if state.reserved_us is not None:
        budget_us = max(budget_us, state.reserved_us + spacing_us)
    slot_us = budget_us if state.front_tat_us is None else max(budget_us, state.front_tat_us)
    if slot_us >= ticket_us:
        return Ahead(ticket_us, False, False)
    return Ahead(slot_us, True, slot_us > budget_us)


def after_front(state: BucketState, slot_us: int, spacing_us: int, pace: Pace) -> BucketState:
    """``state`` after an interactive start of ``pace.cost`` was granted the front ``slot_us``:
    the slot reserved, the share's GCRA moved on, the tickets pushed back by its cost (the
    grants' GCRAs count it at ``slot_us`` in virtual time); the latest ticket slot stays."""
    state = rebased(state)
    share = 1.0 if pace.share is None else pace.share
    cost = max(1, pace.cost)
    pushed_us = state.pushed_us + cost * spacing_us
    virtual = in_virtual_time(state)
    virtual = limits.after_grant(virtual, slot_us, pace.limits, pace.cost)
    virtual = after_grant(virtual, slot_us, spacing_us, pace.burst, pace.cost)
    share_tat_us = slot_us if state.front_tat_us is None else max(state.front_tat_us, slot_us)
    return replace(
        in_ticket_time(virtual, pushed_us),
        last_slot_us=state.last_slot_us,
        reserved_us=slot_us,
        front_tat_us=share_tat_us + cost * share_spacing(spacing_us, share),
    )


def in_virtual_time(state: BucketState) -> BucketState:
    """``state`` with its grants' times (``tat_us``, ``last_slot_us``, the limits' grants') in
    virtual time and ``pushed_us`` 0: for a step that reads or sets them beside the starts'
    times (a grant, a throttle, a fence)."""
    return replace(_shifted(state, state.pushed_us), pushed_us=0)


def in_ticket_time(state: BucketState, pushed_us: int) -> BucketState:
    """``in_virtual_time``'s inverse: the grants' times back in ticket time under ``pushed_us``."""
    return replace(_shifted(state, -pushed_us), pushed_us=pushed_us)


def _shifted(state: BucketState, by_us: int) -> BucketState:
    """``state`` with ``tat_us``, ``last_slot_us`` and the limits' grants' times ``by_us``
    later."""
    if by_us == 0:
        return state
    tats = tuple(
        LimitTats(None if t.grant_us is None else t.grant_us + by_us, t.start_us)
        for t in state.limit_tats
    )
    last_slot_us = None if state.last_slot_us is None else state.last_slot_us + by_us
    return replace(state, tat_us=state.tat_us + by_us, last_slot_us=last_slot_us, limit_tats=tats)


def rebased(state: BucketState) -> BucketState:
    """Once the latest granted slot has started, ``pushed_us`` folds into the grants' times (a
    grant does it first): tickets granted from now on are in virtual time again.
    ``current_slot_us`` stays: a ticket that shares the started slot (a burst) still starts,
    as a late one, until a later ticket starts."""
    if state.pushed_us == 0 or (
        state.last_slot_us is not None and state.current_slot_us < state.last_slot_us
    ):
        return state
    return in_virtual_time(state)


def latest_tat(state: BucketState, tat_us: int) -> int:
    """``tat_us``, or the latest time in virtual time of the grants' GCRA, the limits' and the
    share's if later (``expires_in_us``: until then a new state would not act the same)."""
    virtual = in_virtual_time(state)
    tat_us = max(tat_us, virtual.tat_us)
    if state.front_tat_us is not None:
        tat_us = max(tat_us, state.front_tat_us)
    return limits.latest_tat(virtual, tat_us)
