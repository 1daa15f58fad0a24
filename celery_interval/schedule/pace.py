"""The interval a bucket runs at: configured, overridden by ``set_interval``, or adapted."""

from __future__ import annotations

import math
from dataclasses import replace

from celery_interval.schedule import front
from celery_interval.schedule.burst import rescaled_extra
from celery_interval.schedule.state import (
    MAX_LEAD_US,
    BucketState,
    new_state,
    virtual_now,
)

#: An adaptive bucket throttled within this many starts of its last throttle slows by a third;
#: after a longer clean run by a tenth.
ADAPT_CLEAN_RUN = 20
#: Each clean start of an adaptive bucket adds this share of the configured rate back.
ADAPT_STEPS = 2_000


def effective_interval(state: BucketState, interval_us: int) -> int:
    """A ``set_interval`` override wins over the interval the caller has configured, which an
    adaptive bucket's throttles may have lengthened."""
    if state.interval_override_us is not None:
        return state.interval_override_us
    if state.adapted_us is not None:
        return max(state.adapted_us, interval_us)
    return interval_us


def eased(state: BucketState, interval_us: int) -> BucketState:
    """After a clean start: an adapted interval goes back toward ``interval_us`` by adding
    ``1/ADAPT_STEPS`` of the configured rate (the same double arithmetic as the Lua)."""
    if state.adapted_us is None:
        return state
    adapted_us = math.floor(state.adapted_us / (1 + state.adapted_us / (interval_us * ADAPT_STEPS)))
    return replace(
        state,
        adapted_us=None if adapted_us <= interval_us else adapted_us,
        clean_starts=state.clean_starts + 1,
    )


def slowed(state: BucketState, interval_us: int, adapt_max_us: int) -> BucketState:
    """A throttle of an adaptive bucket: its interval grows by half (a third off the rate) when
    it was throttled within ``ADAPT_CLEAN_RUN`` starts, else by a ninth (a tenth off the rate);
    at most ``adapt_max_us``. An overridden interval is left alone (the override wins)."""
    if state.interval_override_us is not None:
        return state
    current_us = effective_interval(state, interval_us)
    if state.adapted_us is not None and state.clean_starts < ADAPT_CLEAN_RUN:
        longer_us = (current_us * 3 + 1) // 2
    else:
        longer_us = (current_us * 10 + 8) // 9
    return replace(state, adapted_us=max(interval_us, min(adapt_max_us, longer_us)), clean_starts=0)


def set_interval(
    state: BucketState | None,
    now_us: int,
    interval_us: int,
    new_interval_us: int,
    *,
    born_us: int,
) -> BucketState:
    """Override the configured interval; a longer one also pushes ``tat`` (never backwards)."""
    if state is None:
        state = new_state(now_us, interval_us, born_us)
    return _respaced(state, interval_us, new_interval_us)


def unset_interval(state: BucketState | None, interval_us: int) -> tuple[BucketState | None, bool]:
    """Drop the override, and say whether there was one: the configured ``interval_us`` is
    back, by ``set_interval``'s rule (a longer one pushes ``tat``, a shorter one leaves it).
    Epoch, tickets, pause and granted slots are kept; a bucket with no override (or no state)
    is returned as it is."""
    if state is None or state.interval_override_us is None:
        return state, False
    return _respaced(state, interval_us, None), True


def _respaced(state: BucketState, interval_us: int, override_us: int | None) -> BucketState:
    """``state`` under the override ``override_us`` (None: none); when the effective interval
    grows, ``tat`` moves on by the difference, never backwards; the burst used keeps its units."""
    old_us = effective_interval(state, interval_us)
    state = replace(state, interval_override_us=override_us)
    new_us = effective_interval(state, interval_us)
    return replace(
        state,
        tat_us=state.tat_us + max(0, new_us - old_us),
        start_extra_us=rescaled_extra(state.start_extra_us, old_us, new_us),
    )


def fenced(state: BucketState, now_us: int, interval_us: int) -> BucketState:
    """The state as a master promoted at or before ``now_us`` finds it (a Redis replica): the
    old master's last writes may be missing, a start admitted up to MAX_LEAD_US ahead among
    them, so no start before one interval after ``now + MAX_LEAD_US``, and a burst counts as
    used then (``lost_start_us``, as after a lost state). Epoch, tickets, pause and overrides
    are kept. Only a replicated Redis store applies it (lib.lua's fence)."""
    last_us = max(state.last_start_us, virtual_now(state, now_us) + MAX_LEAD_US)
    virtual = front.in_virtual_time(state)
    tat_us = max(virtual.tat_us, last_us + effective_interval(state, interval_us))
    lost_us = last_us if state.lost_start_us is None else max(state.lost_start_us, last_us)
    fenced_state = replace(virtual, last_start_us=last_us, tat_us=tat_us, lost_start_us=lost_us)
    return front.in_ticket_time(fenced_state, state.pushed_us)
