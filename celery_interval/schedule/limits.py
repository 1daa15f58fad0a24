"""Several limits of one bucket: each extra limit runs the burst's two GCRAs beside the primary.

An extra limit ``Limit(T_i, B_i)`` keeps its own grants' and starts' theoretical arrival times in
the bucket's record (``BucketState.limit_tats``), updated in the same step as the primary's. A
grant's slot is the latest of every limit's earliest (and never before the last slot: tickets
keep their order); a claim starts only where every limit's starts' GCRA conforms, so for every
limit and every window of starts of length ``span``: Σ cost <= B_i + span / T_i. With no extra
limits every function here leaves the state as it is and constrains nothing.
"""

from __future__ import annotations

from dataclasses import replace

from celery_interval.schedule.burst import room
from celery_interval.schedule.burst import units_left as _units_left
from celery_interval.schedule.state import BucketState, Limit, Limits, LimitTats


def _tats(state: BucketState, index: int) -> LimitTats:
    if index < len(state.limit_tats):
        return state.limit_tats[index]
    return LimitTats(None, None)


def _lost(state: BucketState, limit: Limit, tat_us: int | None) -> int | None:
    """``tat_us``, or later in a new epoch after state loss: the burst counts as used then."""
    if state.lost_start_us is None:
        return tat_us
    lost_us = state.lost_start_us + max(1, limit.burst) * limit.interval_us
    return lost_us if tat_us is None else max(tat_us, lost_us)


def _with(state: BucketState, tats: list[LimitTats]) -> BucketState:
    """``state`` with the first ``len(tats)`` limits' times replaced (later ones kept: a limit
    another worker still counts)."""
    return replace(state, limit_tats=(*tats, *state.limit_tats[len(tats) :]))


def earliest_start(state: BucketState, limits: Limits, cost: int, earliest_us: int) -> int:
    """``earliest_us``, or later where a start of ``cost`` conforms to every limit."""
    return _earliest(state, limits, cost, earliest_us, start=True)


def next_slot(state: BucketState, limits: Limits, cost: int, slot_us: int) -> int:
    """``slot_us``, or later where a ticket of ``cost`` conforms to every limit's grants."""
    return _earliest(state, limits, cost, slot_us, start=False)


def after_start(state: BucketState, start_us: int, limits: Limits, cost: int) -> BucketState:
    """``state`` after a start of ``cost`` at ``start_us``; call it before the primary's
    ``after_start`` (which ends the new epoch's ``lost_start_us``)."""
    tats = []
    for i, limit in enumerate(limits):
        old = _tats(state, i)
        start_us_after = _spent(_lost(state, limit, old.start_us), start_us, limit, cost)
        tats.append(LimitTats(_lost(state, limit, old.grant_us), start_us_after))
    return _with(state, tats)


def after_grant(state: BucketState, slot_us: int, limits: Limits, cost: int) -> BucketState:
    """``state`` after a ticket of ``cost`` was granted ``slot_us``."""
    tats = []
    for i, limit in enumerate(limits):
        old = _tats(state, i)
        grant_us = _spent(_lost(state, limit, old.grant_us), slot_us, limit, cost)
        tats.append(LimitTats(grant_us, old.start_us))
    return _with(state, tats)


def _earliest(state: BucketState, limits: Limits, cost: int, at_us: int, *, start: bool) -> int:
    """``at_us``, or later where ``cost`` conforms to every limit's starts' (``start``) or
    grants' GCRA."""
    for i, limit in enumerate(limits):
        tats = _tats(state, i)
        tat_us = _lost(state, limit, tats.start_us if start else tats.grant_us)
        if tat_us is not None:
            at_us = max(at_us, tat_us - room(limit.burst, cost) * limit.interval_us)
    return at_us


def _spent(tat_us: int | None, at_us: int, limit: Limit, cost: int) -> int:
    """A GCRA's ``tat_us`` (None: nothing counted) after ``cost`` units at ``at_us``."""
    return (at_us if tat_us is None else max(tat_us, at_us)) + max(1, cost) * limit.interval_us


def emptied(
    state: BucketState, limits: Limits, cost: int, first_us: int
) -> tuple[BucketState, int]:
    """A throttle: every limit's burst all used at the last start; ``first_us`` (the primary's
    earliest start of ``cost`` then), or later where a limit asks. Call it before the
    primary's ``emptied`` (which ends the new epoch's ``lost_start_us``)."""
    tats = []
    for i, limit in enumerate(limits):
        old = _tats(state, i)
        tat_us = state.last_start_us + max(1, limit.burst) * limit.interval_us
        start_tat_us = _lost(state, limit, old.start_us)
        if start_tat_us is not None:
            tat_us = max(tat_us, start_tat_us)
        first_us = max(first_us, tat_us - room(limit.burst, cost) * limit.interval_us)
        tats.append(LimitTats(_lost(state, limit, old.grant_us), tat_us))
    return _with(state, tats), first_us


def kept(state: BucketState, slot_us: int, limits: Limits) -> BucketState:
    """A throttled copy keeps ``slot_us``: every limit's grants come a whole burst after it."""
    tats = []
    for i, limit in enumerate(limits):
        old = _tats(state, i)
        tat_us = slot_us + max(1, limit.burst) * limit.interval_us
        tats.append(LimitTats(tat_us if old.grant_us is None else max(old.grant_us, tat_us),
                              old.start_us))  # fmt: skip
    return _with(state, tats)


def latest_tat(state: BucketState, tat_us: int) -> int:
    """``tat_us``, or the latest of every limit's times kept in ``state`` if later: until
    virtual time reaches it, a new state would not act the same."""
    for tats in state.limit_tats:
        for t_us in (tats.grant_us, tats.start_us):
            tat_us = tat_us if t_us is None else max(tat_us, t_us)
    return tat_us


def next_grant_tat(state: BucketState, tat_us: int) -> int:
    """``tat_us`` (the primary's grants' time), or a limit's if later: ``status``'s next slot."""
    for tats in state.limit_tats:
        tat_us = tat_us if tats.grant_us is None else max(tat_us, tats.grant_us)
    return tat_us


def units_left(state: BucketState, limits: Limits, v_us: int) -> tuple[int, ...]:
    """Each limit's grants' budget left at virtual ``v_us``, in whole units."""
    left = []
    for i, limit in enumerate(limits):
        tat_us = _lost(state, limit, _tats(state, i).grant_us)
        full = max(1, limit.burst)
        left.append(full if tat_us is None else _units_left(tat_us, v_us, limit.interval_us, full))
    return tuple(left)
