"""Throttles: the called service said "retry after"; the throttled copy keeps its place."""

from __future__ import annotations

from dataclasses import replace

from celery_interval.schedule import front, limits
from celery_interval.schedule.burst import emptied
from celery_interval.schedule.core import done, status
from celery_interval.schedule.pace import effective_interval, slowed
from celery_interval.schedule.state import (
    GRANTED_TTL_US,
    Backoff,
    BucketState,
    Granted,
    Mark,
    Status,
    new_state,
    virtual_now,
)


def done_mark(mark: Mark | None, now_us: int, dedupe_ttl_us: int) -> Mark:
    """The mark after an ack of the copy: ``done``, except for a throttled task's live place
    (the ack is the throttled run's; the copy sent again still has to run)."""
    if isinstance(mark, Granted) and mark.front and mark.expires_real_us > now_us:
        return mark
    return done(now_us, dedupe_ttl_us)


def throttle(
    state: BucketState | None,
    mark: Mark | None,
    now_us: int,
    interval_us: int,
    backoff: Backoff,
    *,
    born_us: int,
) -> tuple[BucketState, Mark, Status]:
    """The called service said "retry after ``backoff.retry_after_us``": no start of the bucket
    before then, and the throttled copy keeps its place, the first slot after, ahead of every
    ticket; an adaptive bucket's interval is lengthened first (``slowed``).

    Every slot shifts (``offset``) so that the next start, one interval after the last (a
    bucket's burst counts as used up: ``schedule.burst.emptied``), comes ``retry_after_us``
    from now at the earliest. The throttled copy keeps that slot, or the one after the slots
    kept by earlier throttled copies that have not started yet (their order is the order of
    their throttles): its mark becomes a ``front`` grant of it (its copy sent again gets it),
    it is ``reserved``, and every other claim starts an interval after it at the earliest.
    The wait's end is kept (``throttled_until_us``): a start admitted before the throttle that
    its holder claims again is not started inside the wait (``claim`` admits a new one).
    """
    if state is None:
        state = new_state(now_us, interval_us, born_us)
    pushed_us = state.pushed_us
    state = front.in_virtual_time(state)
    if backoff.adapt_max_us is not None:
        state = slowed(state, interval_us, backoff.adapt_max_us)
    spacing_us = effective_interval(state, interval_us)
    v = virtual_now(state, now_us)
    emptied_state, first_us = emptied(state, spacing_us, backoff.burst, backoff.cost)
    state, first_us = limits.emptied(state, backoff.limits, backoff.cost, first_us)
    state = replace(emptied_state, limit_tats=state.limit_tats)
    shift_us = max(0, v + max(0, backoff.retry_after_us) - first_us)
    slot_us = first_us
    if state.reserved_us is not None:
        slot_us = max(first_us, state.reserved_us + spacing_us)
    state = replace(
        state,
        offset_us=state.offset_us + shift_us,
        tat_us=max(state.tat_us, slot_us + max(1, backoff.burst) * spacing_us),
        reserved_us=slot_us,
    )
    state = front.in_ticket_time(limits.kept(state, slot_us, backoff.limits), pushed_us)
    v -= shift_us
    until_us = v + max(0, backoff.retry_after_us)
    if state.throttled_until_us is not None:
        until_us = max(until_us, state.throttled_until_us)
    state = replace(state, throttled_until_us=until_us)
    expires_real_us = now_us + slot_us - v + GRANTED_TTL_US
    place = Granted(state.epoch, backoff.ticket, slot_us, expires_real_us, True)
    return state, place, status(state, now_us, interval_us, born_us=born_us)
