"""Fair share: an outer bucket's starts divided among the inner buckets that wait, by weight.

Start-time fair queuing over the outer bucket's starts. Each inner bucket (a *key*) has a
finish tag in the outer's *fair time* (µs of the outer's interval, scaled by weight): a start
of ``cost`` by a key of ``weight`` begins at ``max(its finish tag, V)`` and moves the tag on by
``cost * spacing_us // weight``; ``V``, the fair time, is the largest start tag admitted. A key
*waits* from a claim that came due (within its lead of a start its own limits allow), and
after each start from when its own limits allow the next (``due_us``: a backlogged key
claims again by then), until ``want_until_us`` passes without it claiming again.

A claim of a key that its own limits admit asks for its *turn* (``turn``), whether or not
the outer's budget is free yet, and so the key waits: it is its turn when no other waiting
key that can claim by the time the budget is free (a key told to wait claims again when its
wait ends) has a start tag before its own; else it comes back after about 7/8 of the starts
the keys before it take, one interval each (they may run out of work sooner). So the starts
go to the waiting keys in proportion to their weights (weighted max-min: a key that its own
interval holds below its share does not wait between its starts, and leaves the rest to the
others), and while any key waits the outer's budget is used: once the budget has been free
``idle_us_of`` past its earliest start, any waiting key may take it (a key that stopped
claiming costs at most that per start, until its ``want_until_us`` passes). A key that
waited for nothing keeps no credit: its next start tag is at least ``V``.

The outer's budget (interval, burst, limits) is kept exactly as before by ``schedule.outer``;
a turn only chooses which key's start takes it. Integer arithmetic throughout, so the Lua
mirror computes the same tags.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["FairShare", "Tag", "idle_us_of", "started", "turn"]

#: A key that claimed and was told to wait counts as waiting this much past its turn's
#: estimate (in intervals of the outer bucket): long enough for its worker to claim again.
WANT_GRACE_INTERVALS = 4
#: A key told to wait its turn comes back after this share of the estimate: keys ahead of it
#: may run out of work sooner, and a claim that comes early only asks again.
TURN_EARLY_NUM, TURN_EARLY_DEN = 7, 8
#: The shortest: a claim that is not its key's turn is never admitted, however soon the
#: turn is expected.
MIN_TURN_WAIT_US = 5000
#: The longest wait a turn asks for before the claim looks again, µs.
MAX_TURN_WAIT_US = 1_000_000


@dataclass(frozen=True, slots=True, order=True)
class Tag:
    """A key's place in the fair share: its finish tag (fair time, µs), until when it counts
    as waiting (the store's clock, µs; 0: not waiting), its weight, and from when it may start
    again by its own limits or its claim told to wait comes back (the store's clock: before
    then it waits for nothing here)."""

    key: str
    finish_us: int
    want_until_us: int
    weight: int
    due_us: int = 0


@dataclass(frozen=True)
class FairShare:
    """An outer bucket's fair share: its fair time ``v_us`` and the keys' tags, by key (a
    store's clock is never 0, so a ``want_until_us`` of 0 means not waiting)."""

    v_us: int = 0
    tags: tuple[Tag, ...] = ()

    def tag_of(self, key: str, weight: int) -> Tag:
        """``key``'s tag (a new one at the fair time, not waiting, for a key not known)."""
        for tag in self.tags:
            if tag.key == key:
                return replace(tag, weight=weight)
        return Tag(key, self.v_us, 0, weight)


def idle_us_of(spacing_us: int) -> int:
    """How long the outer's budget may stay free past its earliest start before any waiting
    key takes it: half its interval, at least 2 ms."""
    return max(spacing_us // 2, 2_000)


def _start_tag(fair: FairShare, tag: Tag) -> int:
    return max(fair.v_us, tag.finish_us)


def _with(fair: FairShare, tag: Tag, now_us: int) -> FairShare:
    """``fair`` with ``tag`` in place of the key's; keys neither waiting nor ahead of the fair
    time are dropped (they would start at ``v_us`` anyway)."""
    kept = tuple(
        t
        for t in fair.tags
        if t.key != tag.key and (t.want_until_us >= now_us or t.finish_us > fair.v_us)
    )
    return replace(fair, tags=tuple(sorted((*kept, tag))))


def _starts_before(fair: FairShare, tag: Tag, until_us: int, spacing_us: int) -> int:
    """How many starts of one unit the key of ``tag`` takes before fair time ``until_us``."""
    step_us = max(1, spacing_us // max(1, tag.weight))
    return max(0, -((_start_tag(fair, tag) - until_us) // step_us))


def turn(
    fair: FairShare,
    key: str,
    weight: int,
    now_us: int,
    spacing_us: int,
    free_in_us: int,
    lead_us: int = 0,
) -> tuple[FairShare, int]:
    """A claim of ``key`` that its own limits admit, made ``lead_us`` ahead of its start at the
    most, ``free_in_us`` before the outer's budget is free (negative: free since): (the fair
    share with ``key`` waiting, 0) when it may start (the budget is free within the lead and
    it is its turn, or the budget has been free ``idle_us_of`` already), else (it, µs until
    it may claim again: the budget's wait, or the turn's estimate if later)."""
    tag = fair.tag_of(key, weight)
    mine_us = _start_tag(fair, tag)
    free_by_us = now_us + max(free_in_us, 0)
    others = [
        t
        for t in fair.tags
        if t.key != key and t.want_until_us >= now_us and t.due_us <= free_by_us
    ]
    first_us = min((_start_tag(fair, t) for t in others), default=mine_us)
    wait_us = max(0, free_in_us - lead_us)
    if mine_us > first_us and free_in_us > -idle_us_of(spacing_us):
        ahead = sum(_starts_before(fair, t, mine_us, spacing_us) for t in others)
        ahead_us = ahead * spacing_us * TURN_EARLY_NUM // TURN_EARLY_DEN
        wait_us = min(max(MIN_TURN_WAIT_US, free_in_us + ahead_us - lead_us), MAX_TURN_WAIT_US)
    want_until_us = now_us + wait_us + WANT_GRACE_INTERVALS * spacing_us
    back = replace(tag, want_until_us=want_until_us, due_us=now_us + wait_us)
    return _with(fair, back, now_us), wait_us


def started(
    fair: FairShare,
    key: str,
    weight: int,
    cost: int,
    spacing_us: int,
    now_us: int,
    due_us: int,
) -> FairShare:
    """The fair share after ``key`` started ``cost`` units: its tag moves on by its weighted
    share of the outer's interval, the fair time to its start tag; it may start again from
    ``due_us`` by its own limits, and counts as waiting from then (for its next task) until
    a claim of it or a few intervals say otherwise."""
    tag = fair.tag_of(key, weight)
    start_us = _start_tag(fair, tag)
    finish_us = start_us + max(1, cost) * spacing_us // max(1, weight)
    fair = replace(fair, v_us=max(fair.v_us, start_us))
    want_until_us = max(now_us, due_us) + WANT_GRACE_INTERVALS * spacing_us
    after = replace(tag, finish_us=finish_us, want_until_us=want_until_us, due_us=due_us)
    return _with(fair, after, now_us)
