"""The model's records: a bucket's state, a copy's mark, what each operation asks and answers."""

from __future__ import annotations

import enum
from dataclasses import dataclass

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
#: A running body's place is renewed at least this often (``renew_place``), so it takes back
#: a place the store lost within this long.
PLACE_RENEW_US = 1_000_000
#: After the store's birth, capped claims wait this long for running bodies to take back their
#: places (``claim_capped``): three renewals.
PLACE_SETTLE_US = 3 * PLACE_RENEW_US
#: A claim by a worker that saw an earlier birth (the store lost its state since) holds new
#: starts this long for the done marks the workers remember to be written again
#: (``schedule.places.marks_settle_until_us``).
MARKS_SETTLE_US = 3_000_000


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


@dataclass(frozen=True, slots=True)
class Limit:
    """An extra limit of a bucket beside its interval: at most ``burst`` units back to back,
    refilled one per ``interval_us`` (a rate N/unit has the interval unit/N)."""

    interval_us: int
    burst: int = 1


#: A bucket's extra limits, in the order configured (``schedule.limits``).
Limits = tuple[Limit, ...]


@dataclass(frozen=True, slots=True)
class LimitTats:
    """An extra limit's theoretical arrival times: the grants' and the starts' (None: nothing
    counted yet; a new epoch after state loss counts the burst as used, ``lost_start_us``)."""

    grant_us: int | None
    start_us: int | None


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
    #: The last slot kept by a throttled task (``throttle``; several throttled tasks keep
    #: consecutive slots): no other copy starts before an interval after it.
    reserved_us: int | None = None
    #: An adaptive bucket's interval, lengthened by throttles, eased back by clean starts
    #: (None: the configured one).
    adapted_us: int | None = None
    #: Starts since the last throttle of an adaptive bucket.
    clean_starts: int = 0
    #: The starts' theoretical arrival time (``schedule.burst``) is ``last_start_us`` + one
    #: interval + this: the budget used beyond one unit (always 0 when every start costs one).
    start_extra_us: int = 0
    #: The latest slot granted (tickets' slots never go back; None: none recorded).
    last_slot_us: int | None = None
    #: The latest start a lost state may have admitted (``new_state``): until the first start,
    #: the burst counts as used up then (None: known).
    lost_start_us: int | None = None
    #: The extra limits' GCRAs, by position in the bucket's ``Limits`` (missing: None, None).
    limit_tats: tuple[LimitTats, ...] = ()
    #: The interactive starts' theoretical arrival time (``schedule.front``; None: none yet).
    front_tat_us: int | None = None
    #: How far the interactive starts ahead of the tickets pushed them: a ticket's slot (and
    #: ``tat_us``, ``last_slot_us``, ``current_slot_us``, the limits' grants' times) is in
    #: virtual time minus this (``schedule.front``).
    pushed_us: int = 0
    #: The end of the latest throttle's wait (None: no throttle yet): a lease whose start comes
    #: before it was admitted before that throttle, whose shift moved the start into the wait.
    throttled_until_us: int | None = None
    #: Starts claims admitted in this epoch: a lease keeps the count after its own, so its
    #: holder's claim again knows whether any start came since.
    admitted: int = 0


@dataclass(frozen=True)
class Lease:
    """A task copy's claim: ``holder`` may start it; others are HELD until ``expires_real_us``.

    ``epoch``, ``admitted`` and ``tat_us`` (the bucket's count of admitted starts and its
    starts' theoretical arrival time right after this start was admitted) tell a claim again by
    its holder whether anything moved the bucket since: while all three are the bucket's, no
    start came since and the interval did not grow, so a start the holder missed moves to now
    (``schedule.burst.moved``).
    """

    holder: str
    start_us: int
    expires_real_us: int
    epoch: int | None = None
    tat_us: int | None = None
    admitted: int | None = None
    #: A nested bucket's: its outer bucket's starts' TAT right after this start was admitted
    #: (``schedule.outer``): while it is the outer's, a start missed moves there too.
    outer_tat_us: int | None = None


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
    wins) and how far from now the slot may be at the earliest (a countdown or ETA); the
    bucket's ``burst`` and the task's ``cost``, in units of one interval's budget."""

    interval_us: int
    not_before_in_us: int = 0
    burst: int = 1
    cost: int = 1
    #: The slot may be at most this far from now (None: any): a later one is not granted.
    not_after_in_us: int | None = None
    #: The bucket's extra limits: the slot conforms to each of them too.
    limits: Limits = ()
    #: An interactive caller's share of the bucket's rate, in (0, 1) (``schedule.front``):
    #: its start goes ahead of the granted tickets. None: it queues as a task does.
    share: float | None = None


@dataclass(frozen=True, slots=True)
class Slot:
    """The granted slot a claim names: ``slot_us`` of ``epoch``."""

    epoch: int
    slot_us: int


@dataclass(frozen=True, slots=True)
class Backoff:
    """What a throttle asks for: no start for ``retry_after_us``, the throttled copy's
    ``ticket`` kept; ``adapt_max_us`` (an adaptive bucket) lengthens the interval up to it;
    the bucket's ``burst`` (emptied by the throttle) and the throttled task's ``cost``."""

    retry_after_us: int
    ticket: int = 0
    adapt_max_us: int | None = None
    burst: int = 1
    cost: int = 1
    #: The bucket's extra limits: the throttle empties each one's budget too.
    limits: Limits = ()


@dataclass(frozen=True, slots=True)
class ClaimTerms:
    """Who claims, and how: ``holder`` leases the task for ``lease_us``, may claim up to
    ``lead_us`` before its start, and needs ``handoff_us`` to hand it to a pool process.

    ``cap`` (a capped bucket, ``claim_capped``): at most this many bodies run at once; a start
    takes a place for ``place_us`` (None: ``lease_us``), renewed while the body runs.

    ``burst`` and ``cost`` (units of one interval's budget): the bucket's burst, the task's
    cost (``schedule.burst``)."""

    holder: str
    lease_us: int
    lead_us: int = 0
    handoff_us: int = 0
    cap: int | None = None
    place_us: int | None = None
    burst: int = 1
    cost: int = 1
    #: The bucket's extra limits: a start conforms to each one's starts' GCRA too.
    limits: Limits = ()
    #: No start before this virtual time of the bucket (None: no such floor): an outer
    #: bucket's budget (``schedule.outer``).
    not_before_us: int | None = None
    #: The outer bucket's interval in force (a nested bucket; 0: none): it spaces this
    #: bucket's starts too, so the handoff may take up to it.
    outer_spacing_us: int = 0
    #: The store's birth the claimer saw last (its birth marker; None: none): a store born
    #: since lost its state (``schedule.places.marks_settle_until_us``).
    knew_born_us: int | None = None
    #: The claimed message was delivered before (a body of it may have run under a birth the
    #: store lost: ``schedule.places.marks_settle_until_us``).
    redelivered: bool = False


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
    #: The store's birth marker as the claim found it (None: none read, as on a Cluster).
    born_us: int | None = None


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
    #: Bodies holding a live place of the bucket (a capped bucket; 0 where not read).
    running: int = 0
    #: The grants' budgets left now, in whole units: the interval's burst, then each extra
    #: limit's (() where the status was read without the bucket's pace).
    units_left: tuple[int, ...] = ()
    #: The outer bucket a nested bucket's starts also count in (None: not nested, or read
    #: alone); ``paused`` and ``next_slot_in_us`` then include its (``schedule.outer``).
    outer: str | None = None
    #: The outer bucket is paused, so this one's claims answer PAUSED.
    outer_paused: bool = False


@dataclass(frozen=True)
class Unset:
    """An ``unset_interval``'s answer: the bucket's status after it, and whether an override
    was dropped (False: the bucket had none, and nothing changed)."""

    status: Status
    dropped: bool


def new_state(now_us: int, interval_us: int, born_us: int) -> BucketState:
    """A new epoch, as if its last start was one interval ago, but never before
    ``born_us + MAX_LEAD_US``: a state lost at ``born_us`` may have admitted a start that far ahead
    (and, in a bucket with a burst, used all of it then: ``lost_start_us``).

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
        lost_start_us=born_us + MAX_LEAD_US,
    )


def virtual_now(state: BucketState, now_us: int) -> int:
    """Virtual time: real time minus the total length of past pauses, frozen while paused."""
    real_us = now_us if state.paused_at_real_us is None else state.paused_at_real_us
    return real_us - state.offset_us


def clamp_lead(lead_us: int) -> int:
    """A claim's lead, kept within 0..MAX_LEAD_US."""
    return min(max(0, lead_us), MAX_LEAD_US)


def live(mark: Mark | None, now_us: int) -> Mark | None:
    """The mark if it has not expired at ``now_us``."""
    return mark if mark is not None and mark.expires_real_us > now_us else None
