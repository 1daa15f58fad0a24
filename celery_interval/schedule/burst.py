"""Burst and cost: the GCRA that lets ``burst`` units start back to back after an idle spell.

A bucket's budget refills one unit per interval ``T`` up to ``burst`` (B) units; a start of cost
``c`` spends ``c`` units. Grants and claims each run a GCRA with theoretical arrival time
``tat``: a cost-``c`` event at ``t`` conforms iff ``tat - (B - c)·T <= t``, and moves ``tat`` to
``max(tat, t) + c·T``. The claims' GCRA, on the starts themselves, gives for every set of starts
within a window of length ``span``: Σ cost <= B + span / T, whatever order the claims arrive in.
With B = c = 1 both reduce to the plain slots: the next slot is ``tat``, the next start one
interval after the last.
"""

from __future__ import annotations

from dataclasses import replace

from celery_interval.schedule.state import BucketState


def start_tat(state: BucketState, spacing_us: int, burst: int) -> int:
    """The starts' theoretical arrival time; a new epoch counts the burst used at its
    ``lost_start_us`` (a lost state may have spent it then)."""
    tat_us = state.last_start_us + spacing_us + state.start_extra_us
    if state.lost_start_us is not None:
        tat_us = max(tat_us, state.lost_start_us + max(1, burst) * spacing_us)
    return tat_us


def earliest_start(state: BucketState, spacing_us: int, burst: int, cost: int) -> int:
    """The earliest virtual time a start of ``cost`` conforms to the starts' GCRA."""
    return start_tat(state, spacing_us, burst) - room(burst, cost) * spacing_us


def after_start(
    state: BucketState, start_us: int, spacing_us: int, burst: int, cost: int
) -> BucketState:
    """``state`` after a start of ``cost`` at virtual ``start_us`` (``last_start_us`` never goes
    back: a start admitted with a shorter handoff may come before the last one)."""
    tat_us = max(start_tat(state, spacing_us, burst), start_us) + max(1, cost) * spacing_us
    return _started(state, start_us, tat_us, spacing_us)


def moved(state: BucketState, start_us: int, spacing_us: int, burst: int, cost: int) -> BucketState:
    """``state`` after its last admitted start, which never happened, moved to the later
    ``start_us``. A GCRA's last event moved later leaves ``tat`` at ``max(tat, start + c·T)``:
    later starts come after ``start_us`` as after that one, earlier ones are further from it."""
    tat_us = max(start_tat(state, spacing_us, burst), start_us + max(1, cost) * spacing_us)
    return _started(state, start_us, tat_us, spacing_us)


def _started(state: BucketState, start_us: int, tat_us: int, spacing_us: int) -> BucketState:
    """``state`` with a start at ``start_us`` and the starts' ``tat_us``."""
    last_us = max(state.last_start_us, start_us)
    return replace(
        state,
        last_start_us=last_us,
        start_extra_us=tat_us - last_us - spacing_us,
        lost_start_us=None,
    )


def emptied(state: BucketState, spacing_us: int, burst: int, cost: int) -> tuple[BucketState, int]:
    """``state`` with the burst all used at the last start (a throttle: no burst right after
    a Retry-After), and the earliest start of ``cost`` then; both GCRAs are emptied."""
    tat_us = max(
        start_tat(state, spacing_us, burst), state.last_start_us + max(1, burst) * spacing_us
    )
    slot_us = tat_us - room(burst, cost) * spacing_us
    state = replace(
        state,
        tat_us=max(grant_tat(state, spacing_us, burst), slot_us + max(1, burst) * spacing_us),
        start_extra_us=tat_us - state.last_start_us - spacing_us,
        lost_start_us=None,
    )
    return state, slot_us


def grant_tat(state: BucketState, spacing_us: int, burst: int) -> int:
    """The grants' theoretical arrival time (``tat_us``; a new epoch's burst counts as used)."""
    if state.lost_start_us is None:
        return state.tat_us
    return max(state.tat_us, state.lost_start_us + max(1, burst) * spacing_us)


def next_slot(state: BucketState, v_us: int, spacing_us: int, burst: int, cost: int) -> int:
    """The earliest slot of a ticket of ``cost`` at virtual ``v_us``: the grants' GCRA, never
    before the latest granted slot (tickets keep their order)."""
    slot_us = max(v_us, grant_tat(state, spacing_us, burst) - room(burst, cost) * spacing_us)
    return slot_us if state.last_slot_us is None else max(slot_us, state.last_slot_us)


def after_grant(
    state: BucketState, slot_us: int, spacing_us: int, burst: int, cost: int
) -> BucketState:
    """``state`` after a ticket of ``cost`` was granted ``slot_us``."""
    tat_us = max(grant_tat(state, spacing_us, burst), slot_us) + max(1, cost) * spacing_us
    return replace(state, tat_us=tat_us, last_slot_us=slot_us)


def units_left(tat_us: int, v_us: int, spacing_us: int, burst: int) -> int:
    """The whole units of a budget of ``burst`` that a GCRA at ``tat_us`` has left at virtual
    ``v_us`` (``burst`` once ``tat_us`` is past)."""
    full = max(1, burst)
    return max(0, full - max(0, -(-(tat_us - v_us) // spacing_us)))


def rescaled_extra(extra_us: int, old_spacing_us: int, new_spacing_us: int) -> int:
    """``start_extra_us`` when the interval changes: the budget used beyond one unit, rounded
    up to whole units, kept as that many units of the new interval (a longer interval never
    frees budget)."""
    if extra_us == 0 or old_spacing_us == new_spacing_us:
        return extra_us
    return -(-extra_us // max(1, old_spacing_us)) * new_spacing_us


def room(burst: int, cost: int) -> int:
    """How many units beyond ``cost`` the budget holds: a start may come that many intervals
    before its ``tat``."""
    return max(0, max(1, burst) - max(1, cost))
