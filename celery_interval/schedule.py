"""The pure slot model: a bucket's state and each operation as a function of (state, now_us)."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

__all__ = [
    "IDLE_GRACE_US",
    "MAX_LEAD_US",
    "Backoff",
    "BucketState",
    "Claim",
    "ClaimTerms",
    "Done",
    "Grant",
    "Granted",
    "Lease",
    "Mark",
    "Outcome",
    "Pace",
    "Place",
    "Places",
    "Slot",
    "Status",
    "Unset",
    "claim",
    "claim_capped",
    "clamp_lead",
    "done",
    "done_mark",
    "expires_in_us",
    "grant",
    "live_places",
    "new_state",
    "pause",
    "release",
    "renew",
    "renew_place",
    "set_interval",
    "status",
    "take",
    "take_capped",
    "throttle",
    "unpause",
    "unset_interval",
    "virtual_now",
]


#: A claim may admit a start at most this far ahead; a new epoch assumes a lost one did.
MAX_LEAD_US = 20_000
#: An idle state is kept this long after a new state would behave the same (``expires_in_us``),
#: so a claim that comes a little late still finds its epoch instead of re-ticketing.
IDLE_GRACE_US = 600_000_000
#: A granted slot is remembered this long after its delay, so a redelivered copy of the
#: message (broker timeout, channel closed, holder died) gets the same slot, not a new one.
GRANTED_TTL_US = 3_600_000_000
#: A claim that finds a capped bucket's places full waits at most this long before it looks
#: again (a place freed by ``release`` is not announced).
PLACE_POLL_US = 50_000


class Outcome(str, enum.Enum):
    """What a grant or claim decided; the stores and the Lua scripts return these names."""

    OK = "OK"
    WAIT = "WAIT"
    #: A capped bucket's places are all held by other bodies: look again in ``delay_us``.
    FULL = "FULL"
    PAUSED = "PAUSED"
    HELD = "HELD"
    RETICKET = "RETICKET"
    DUPLICATE = "DUPLICATE"


@dataclass(frozen=True)
class BucketState:
    """A bucket's shared record; every time is integer µs, virtual unless named ``*_real_us``."""

    epoch: int
    offset_us: int
    paused_at_real_us: int | None
    tat_us: int
    ticket: int
    current_slot_us: int
    last_start_us: int
    interval_override_us: int | None
    #: The slot a throttled task keeps (``throttle``): no other copy starts in it.
    reserved_us: int | None = None
    #: An adaptive bucket's interval, lengthened by throttles, eased back by clean starts
    #: (None: the configured one).
    adapted_us: int | None = None
    #: Starts since the last throttle of an adaptive bucket.
    clean_starts: int = 0


@dataclass(frozen=True)
class Lease:
    """A task copy's claim: ``holder`` may start it; others are HELD until ``expires_real_us``."""

    holder: str
    start_us: int
    expires_real_us: int


@dataclass(frozen=True)
class Done:
    """The broker message of this (task_id, retries) was acknowledged; copies are duplicates."""

    expires_real_us: int


@dataclass(frozen=True)
class Granted:
    """This (task_id, retries) holds ticket ``ticket`` at ``slot_us`` of ``epoch``: a copy
    granted again gets the same slot while no later ticket has started; a ``front`` one (a
    throttled task's place, ``throttle``) keeps it even after later starts, and is not marked
    done by the ack of the run that was throttled."""

    epoch: int
    ticket: int
    slot_us: int
    expires_real_us: int
    front: bool = False


Mark = Lease | Done | Granted


@dataclass(frozen=True, slots=True)
class Pace:
    """What a grant asks for: the caller's configured interval (a ``set_interval`` override
    wins) and how far from now the slot may be at the earliest (a countdown or ETA)."""

    interval_us: int
    not_before_in_us: int = 0


@dataclass(frozen=True, slots=True)
class Slot:
    """The granted slot a claim names: ``slot_us`` of ``epoch``."""

    epoch: int
    slot_us: int


@dataclass(frozen=True, slots=True)
class Backoff:
    """What a throttle asks for: no start for ``retry_after_us``, the throttled copy's
    ``ticket`` kept; ``adapt_max_us`` (an adaptive bucket) lengthens the interval up to it."""

    retry_after_us: int
    ticket: int = 0
    adapt_max_us: int | None = None


#: An adaptive bucket throttled within this many starts of its last throttle slows by a third;
#: after a longer clean run by a tenth.
ADAPT_CLEAN_RUN = 20
#: Each clean start of an adaptive bucket adds this share of the configured rate back.
ADAPT_STEPS = 2_000


@dataclass(frozen=True, slots=True)
class ClaimTerms:
    """Who claims, and how: ``holder`` leases the task for ``lease_us``, may claim up to
    ``lead_us`` before its start, and needs ``handoff_us`` to hand it to a pool process.

    ``cap`` (a capped bucket, ``claim_capped``): at most this many bodies run at once; a start
    takes a place for ``place_us`` (None: ``lease_us``), renewed while the body runs."""

    holder: str
    lease_us: int
    lead_us: int = 0
    handoff_us: int = 0
    cap: int | None = None
    place_us: int | None = None


@dataclass(frozen=True, slots=True, order=True)
class Place:
    """A running body's place in a capped bucket, held until ``expires_real_us`` (renewed
    while the body runs, freed by ``release``); ``holder`` names the body's copy.

    The places are a record of their own, not fields of ``BucketState``: a state may be
    dropped when idle (``expires_in_us``) or reset while bodies still run, and neither may
    free their places; a place of a worker that died comes back when it expires.
    Ordered by (expires_real_us, holder), as Redis orders a sorted set."""

    expires_real_us: int
    holder: str


#: A bucket's places, ordered (``live_places``).
Places = tuple[Place, ...]


@dataclass(frozen=True)
class Grant:
    """A ticket and its slot, or DUPLICATE; ``delay_us`` is slot minus virtual now."""

    outcome: Outcome
    epoch: int
    ticket: int
    slot_us: int
    delay_us: int
    paused: bool

    @property
    def slot(self) -> Slot:
        """The slot a claim of this ticket names."""
        return Slot(self.epoch, self.slot_us)


@dataclass(frozen=True)
class Claim:
    """A claim's decision; ``delay_us`` is start_in (OK), wait (WAIT) or lease left (HELD).

    ``now_us`` is the store's real clock at the decision: an OK start is ``now_us + delay_us``.
    """

    outcome: Outcome
    epoch: int
    delay_us: int
    now_us: int


@dataclass(frozen=True)
class Status:
    """A read-only view of a bucket; ``exists`` is False when the store has no record of it."""

    exists: bool
    epoch: int
    interval_us: int
    overridden: bool
    paused: bool
    ticket: int
    next_slot_in_us: int
    current_slot_us: int
    last_start_us: int
    virtual_now_us: int
    #: An adaptive bucket's throttles lengthened ``interval_us`` (clean starts ease it back).
    adapted: bool = False


@dataclass(frozen=True)
class Unset:
    """An ``unset_interval``'s answer: the bucket's status after it, and whether an override
    was dropped (False: the bucket had none, and nothing changed)."""

    status: Status
    dropped: bool


def new_state(now_us: int, interval_us: int, born_us: int) -> BucketState:
    """A new epoch, as if its last start was one interval ago, but never before
    ``born_us + MAX_LEAD_US``: a state lost at ``born_us`` may have admitted a start that far ahead.

    ``born_us`` is when the store's record of the bucket began: the store's birth marker (set
    when a store first finds it missing, so it is new after the store lost everything), or the
    bucket's reset if later. A marker that old lets a new bucket start at once; ``born_us =
    now_us`` (no marker) makes the first start wait one interval and MAX_LEAD_US.
    """
    last_start_us = max(now_us - interval_us, born_us + MAX_LEAD_US)
    return BucketState(
        epoch=now_us,
        offset_us=0,
        paused_at_real_us=None,
        tat_us=last_start_us + interval_us,  # a grant's slot is max(v, earliest start)
        ticket=0,
        current_slot_us=0,
        last_start_us=last_start_us,
        interval_override_us=None,
    )


def virtual_now(state: BucketState, now_us: int) -> int:
    """Virtual time: real time minus the total length of past pauses, frozen while paused."""
    real_us = now_us if state.paused_at_real_us is None else state.paused_at_real_us
    return real_us - state.offset_us


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


def clamp_lead(lead_us: int) -> int:
    """A claim's lead, kept within 0..MAX_LEAD_US."""
    return min(max(0, lead_us), MAX_LEAD_US)


def live(mark: Mark | None, now_us: int) -> Mark | None:
    """The mark if it has not expired at ``now_us``."""
    return mark if mark is not None and mark.expires_real_us > now_us else None


def grant(
    state: BucketState | None, mark: Mark | None, now_us: int, pace: Pace, *, born_us: int
) -> tuple[BucketState, Mark | None, Grant]:
    """Atomically take the next ticket and slot ``max(v, tat, v + pace.not_before_in_us)``.

    Idempotent per (task_id, retries): a copy whose granted slot has not been passed by a
    later start gets that ticket and slot again, so redelivered copies waste no slot.
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
        delay_us = max(0, mark.slot_us - v)
        again = Grant(Outcome.OK, state.epoch, mark.ticket, mark.slot_us, delay_us, paused)
        return state, mark, again
    slot_us = max(v, state.tat_us, v + max(0, pace.not_before_in_us))
    ticket = state.ticket + 1
    spacing_us = effective_interval(state, pace.interval_us)
    state = replace(state, tat_us=slot_us + spacing_us, ticket=ticket)
    if not isinstance(mark, Lease):
        mark = Granted(state.epoch, ticket, slot_us, now_us + slot_us - v + GRANTED_TTL_US)
    return state, mark, Grant(Outcome.OK, state.epoch, ticket, slot_us, slot_us - v, paused)


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
    ``terms.handoff_us`` (or one interval, if shorter) after the claim: the caller's time to
    hand the task to a pool process.
    """
    if state is None:
        state = new_state(now_us, interval_us, born_us)
    mark = live(mark, now_us)
    if state.paused_at_real_us is not None:
        return state, mark, Claim(Outcome.PAUSED, state.epoch, 0, now_us)
    v = virtual_now(state, now_us)
    if isinstance(mark, Done):
        return state, mark, Claim(Outcome.DUPLICATE, state.epoch, 0, now_us)
    spacing_us = effective_interval(state, interval_us)
    earliest_us = state.last_start_us + spacing_us
    slot_us = slot.slot_us
    front = isinstance(mark, Granted) and mark.front and mark.epoch == state.epoch
    if state.reserved_us is not None and not front:
        earliest_us = max(earliest_us, state.reserved_us + spacing_us)
    if isinstance(mark, Lease):
        if mark.holder != terms.holder:
            held_us = mark.expires_real_us - now_us
            return state, mark, Claim(Outcome.HELD, state.epoch, held_us, now_us)
        if mark.start_us >= v:
            return state, mark, Claim(Outcome.OK, state.epoch, mark.start_us - v, now_us)
        # The holder never heard of its admitted start (the reply was lost) and that start has
        # passed: admit a new one, an interval after the last, as if that one had happened.
        slot_us = state.current_slot_us
    elif slot.epoch != state.epoch or (slot_us < state.current_slot_us and not front):
        return state, mark, Claim(Outcome.RETICKET, state.epoch, 0, now_us)
    else:
        earliest_us = max(slot_us, earliest_us)
    lead_us = clamp_lead(terms.lead_us)
    if v + lead_us < earliest_us:
        return state, mark, Claim(Outcome.WAIT, state.epoch, earliest_us - v, now_us)
    # The handoff is at most one interval: a task that reaches its process later than that
    # cannot start exactly anyway, and a longer wait only idles the process.
    start_us = max(v + min(max(0, terms.handoff_us), lead_us, spacing_us), earliest_us)
    state = replace(
        state,
        last_start_us=start_us,
        current_slot_us=max(slot_us, state.current_slot_us) if front else slot_us,
        reserved_us=None if front else state.reserved_us,
    )
    state = eased(state, interval_us)
    lease = Lease(terms.holder, start_us, now_us + terms.lease_us)
    return state, lease, Claim(Outcome.OK, state.epoch, start_us - v, now_us)


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


def live_places(places: Places, now_us: int) -> Places:
    """The places that have not expired at ``now_us``, ordered."""
    return tuple(sorted(p for p in places if p.expires_real_us > now_us))


def claim_capped(
    state: BucketState | None,
    mark: Mark | None,
    places: Places,
    now_us: int,
    interval_us: int,
    slot: Slot,
    terms: ClaimTerms,
    *,
    place: str,
    born_us: int,
) -> tuple[BucketState, Mark | None, Places, Claim]:
    """``claim`` under the bucket's cap ``terms.cap`` (None: no cap, ``places`` untouched).

    A claim ``claim`` would admit starts only if the body ``place`` holds a live place or one
    is free: then it takes (or renews) it until ``now + place_us``. When all ``cap`` live
    places are held by others it is FULL (a wait without lead: the claim comes again when the
    first of them expires, but at most ``PLACE_POLL_US`` later, as a release is not announced),
    and nothing else changes: the slot is not used, the copy keeps its grant.
    """
    state_after, mark_after, claimed = claim(
        state, mark, now_us, interval_us, slot, terms, born_us=born_us
    )
    if terms.cap is None or claimed.outcome is not Outcome.OK:
        return state_after, mark_after, places, claimed
    places = live_places(places, now_us)
    others = tuple(p for p in places if p.holder != place)
    if len(others) == len(places) and len(places) >= terms.cap:
        if state is None:
            state = new_state(now_us, interval_us, born_us)
        wait_us = min(places[0].expires_real_us - now_us, PLACE_POLL_US)
        return state, live(mark, now_us), places, Claim(Outcome.FULL, state.epoch, wait_us, now_us)
    place_us = terms.lease_us if terms.place_us is None else terms.place_us
    taken = live_places((*others, Place(now_us + place_us, place)), now_us)
    return state_after, mark_after, taken, claimed


def take_capped(
    state: BucketState | None,
    mark: Mark | None,
    places: Places,
    now_us: int,
    pace: Pace,
    terms: ClaimTerms,
    *,
    place: str,
    born_us: int,
) -> tuple[BucketState, Mark | None, Places, Grant, Claim | None]:
    """``take`` whose claim is ``claim_capped``: a start needs its slot and a place."""
    kept = [places]

    def capped(
        s: BucketState, m: Mark | None, granted: Slot
    ) -> tuple[BucketState, Mark | None, Claim]:
        s, m, kept[0], claimed = claim_capped(
            s, m, places, now_us, pace.interval_us, granted, terms, place=place, born_us=born_us
        )
        return s, m, claimed

    state, mark, granted, claimed = _take(state, mark, now_us, pace, terms, born_us, capped)
    return state, mark, kept[0], granted, claimed


def release(places: Places, place: str, now_us: int) -> tuple[Places, bool]:
    """The body ``place`` ended: its place is free at once; False if it held no live one."""
    live_now = live_places(places, now_us)
    kept = tuple(p for p in live_now if p.holder != place)
    return kept, len(kept) < len(live_now)


def renew_place(places: Places, place: str, now_us: int, place_us: int) -> tuple[Places, bool]:
    """Extend the live place of the body ``place`` to ``now + place_us``; False if it holds
    none (it expired: the body runs on, but its place may already be someone else's)."""
    kept, held = release(places, place, now_us)
    if not held:
        return kept, False
    return live_places((*kept, Place(now_us + place_us, place)), now_us), True


def done(now_us: int, dedupe_ttl_us: int) -> Done:
    """The message was acknowledged: every later copy of (task_id, retries) is a duplicate."""
    return Done(now_us + dedupe_ttl_us)


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

    Every slot shifts (``offset``) so that the next start, one interval after the last, comes
    ``retry_after_us`` from now at the earliest. That slot is ``reserved``: the throttled copy's
    mark becomes a ``front`` grant of it (its copy sent again gets it), and every other claim
    starts an interval after it at the earliest.
    """
    if state is None:
        state = new_state(now_us, interval_us, born_us)
    if backoff.adapt_max_us is not None:
        state = slowed(state, interval_us, backoff.adapt_max_us)
    spacing_us = effective_interval(state, interval_us)
    v = virtual_now(state, now_us)
    slot_us = state.last_start_us + spacing_us
    shift_us = max(0, v + max(0, backoff.retry_after_us) - slot_us)
    state = replace(
        state,
        offset_us=state.offset_us + shift_us,
        tat_us=max(state.tat_us, slot_us + spacing_us),
        reserved_us=slot_us,
    )
    v -= shift_us
    expires_real_us = now_us + slot_us - v + GRANTED_TTL_US
    place = Granted(state.epoch, backoff.ticket, slot_us, expires_real_us, True)
    return state, place, status(state, now_us, interval_us, born_us=born_us)


def renew(mark: Mark | None, now_us: int, holder: str, lease_us: int) -> tuple[Mark | None, bool]:
    """Extend ``holder``'s live lease to ``now + lease_us``; False if it holds none.

    ``lease_us=0`` ends the lease now: a requeued message's copy takes a new ticket at once.
    """
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
    grows, ``tat`` moves on by the difference, never backwards."""
    old_us = effective_interval(state, interval_us)
    state = replace(state, interval_override_us=override_us)
    grown_us = max(0, effective_interval(state, interval_us) - old_us)
    return replace(state, tat_us=state.tat_us + grown_us)


def status(state: BucketState | None, now_us: int, interval_us: int, *, born_us: int) -> Status:
    """A read-only view; an unknown bucket reads as the new epoch it would get."""
    exists = state is not None
    if state is None:
        state = new_state(now_us, interval_us, born_us)
    v = virtual_now(state, now_us)
    return Status(
        exists=exists,
        epoch=state.epoch,
        interval_us=effective_interval(state, interval_us),
        overridden=state.interval_override_us is not None,
        paused=state.paused_at_real_us is not None,
        ticket=state.ticket,
        next_slot_in_us=max(0, state.tat_us - v),
        current_slot_us=state.current_slot_us,
        last_start_us=state.last_start_us,
        virtual_now_us=v,
        adapted=state.interval_override_us is None and state.adapted_us is not None,
    )


def expires_in_us(state: BucketState, now_us: int, interval_us: int) -> int | None:
    """How long after a write at ``now_us`` the store may drop ``state``; None: keep it.

    Once virtual time has reached both ``tat`` and ``last_start + interval``, a new state (under
    an old birth marker) gives every grant and claim the same delays: only the epoch and the
    ticket numbers differ, and the grace lets claims of the old epoch come late. A paused bucket,
    one with an interval override and an adapted one are kept: a new state would forget the
    pause, the override or what the throttles taught.
    """
    if (
        state.paused_at_real_us is not None
        or state.interval_override_us is not None
        or state.adapted_us is not None
    ):
        return None
    v = virtual_now(state, now_us)
    settled_us = max(state.tat_us, state.last_start_us + effective_interval(state, interval_us), v)
    return settled_us - v + IDLE_GRACE_US
