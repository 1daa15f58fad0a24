"""The pure model driven by table steps: one bucket as a store keeps it, on an injected clock,
results shown relative to T0; the steps' vocabulary, and the names the model's tests share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from celery_interval import schedule
from celery_interval.schedule import (
    Backoff,
    BucketState,
    ClaimTerms,
    Granted,
    Lease,
    Mark,
    Outcome,
    Pace,
    Slot,
)

I_US = 1_000  # the configured interval of every table
T0_US = 1_000_000  # real time of the first step; results are shown relative to it
# In a new store (its birth marker set by the first state it makes) a new epoch's first slot is
# MAX_LEAD_US + one interval after its creation (a lost state may have admitted a start that far
# ahead). Tables not about new epochs create theirs at -ML, so that first slot lands at 1_000.
ML = schedule.MAX_LEAD_US
#: A birth marker long past: a new bucket's first start is at once.
OLD_BORN_US = T0_US - 10**9

Step = tuple[Any, ...]


@dataclass
class Model:
    """One bucket's state and marks as a store would keep them, driven by table steps."""

    interval_us: int = I_US
    now_us: int = T0_US
    state: BucketState | None = None
    marks: dict[tuple[str, int], Mark] = field(default_factory=dict)
    granted: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)  # epoch, slot
    starts_real_us: list[int] = field(default_factory=list)
    born_us: int | None = None  # the store's birth marker: set by the first state made
    reset_us: int | None = None  # the bucket's reset, until its next state is made
    expires_real_us: int | None = None  # when the store may drop the state
    burst: int = 1  # the bucket's burst (units)
    limits: schedule.Limits = ()  # the bucket's extra limits
    costs: dict[str, int] = field(default_factory=dict)  # a task's cost (units; absent: 1)
    handoffs_us: dict[str, int] = field(default_factory=dict)  # a holder's handoff (absent: 0)
    new_starts: list[tuple[int, int]] = field(default_factory=list)  # (real µs, cost), no repeats
    #: Each copy's latest new start, as in ``new_starts``: a readmit takes it out.
    lease_starts: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def run(self, steps: list[Step]) -> list[Any]:
        results = []
        for step in steps:
            before = self.state
            results.append(getattr(self, "op_" + step[0])(*step[1:]))
            if self.state is not None and self.state != before:  # a store writes it
                self.reset_us = None
                expires_in_us = schedule.expires_in_us(self.state, self.now_us, self.interval_us)
                self.expires_real_us = (
                    None if expires_in_us is None else self.now_us + expires_in_us
                )
        return [r for r in results if r is not None]

    def born(self, write: bool = True) -> int:
        """``born_us`` as a store passes it: the marker (set to now when missing) or the reset."""
        if self.born_us is None:
            if not write:
                return self.now_us
            self.born_us = self.now_us
        return self.born_us if self.reset_us is None else max(self.born_us, self.reset_us)

    def op_at(self, t_us: int) -> None:
        self.now_us = T0_US + t_us

    def op_grant(self, task: str, retries: int, not_before_in_us: int) -> tuple[Any, ...]:
        self.state, mark, g = schedule.grant(
            self.state, self.marks.get((task, retries)), self.now_us,
            Pace(self.interval_us, not_before_in_us, self.burst, self.costs.get(task, 1),
                 limits=self.limits),
            born_us=self.born(),
        )  # fmt: skip
        self._put((task, retries), mark)
        if g.outcome is Outcome.DUPLICATE:
            return ("DUPLICATE",)
        self.granted[(task, retries)] = (g.epoch, g.slot_us)
        paused = ("paused",) if g.paused else ()
        return ("OK", g.ticket, g.slot_us - T0_US, g.delay_us, *paused)

    def op_claim(
        self, task: str, retries: int, holder: str, lead_us: int, lease_us: int
    ) -> tuple[Any, ...]:
        epoch, slot_us = self.granted[(task, retries)]
        before = schedule.live(self.marks.get((task, retries)), self.now_us)
        self.state, mark, c = schedule.claim(
            self.state, self.marks.get((task, retries)), self.now_us, self.interval_us,
            Slot(epoch, slot_us), self._terms(task, holder, lease_us, lead_us),
            born_us=self.born(),
        )  # fmt: skip
        self._put((task, retries), mark)
        if c.outcome is Outcome.OK:
            self.starts_real_us.append(self.now_us + c.delay_us - T0_US)
            again = (
                isinstance(before, Lease)
                and isinstance(mark, Lease)
                and (before.holder, before.start_us) == (mark.holder, mark.start_us)
            )
            if not again:
                if isinstance(before, Lease) and before.holder == holder:
                    # A readmit: the start its holder missed never happened.
                    self.new_starts.remove(self.lease_starts[(task, retries)])
                start = (self.now_us + c.delay_us, self.costs.get(task, 1))
                self.new_starts.append(start)
                self.lease_starts[(task, retries)] = start
            return ("OK", c.delay_us)
        if c.outcome in (Outcome.WAIT, Outcome.HELD):
            return (c.outcome.value, c.delay_us)
        return (c.outcome.value,)

    def _terms(self, task: str, holder: str, lease_us: int, lead_us: int) -> ClaimTerms:
        handoff_us = self.handoffs_us.get(holder, 0)
        cost = self.costs.get(task, 1)
        return ClaimTerms(
            holder, lease_us, lead_us, handoff_us, burst=self.burst, cost=cost, limits=self.limits
        )

    def op_done(self, task: str, retries: int, ttl_us: int) -> None:
        key = (task, retries)
        self.marks[key] = schedule.done_mark(self.marks.get(key), self.now_us, ttl_us)

    def op_throttle(
        self, task: str, retries: int, retry_after_us: int, adapt_max_us: int | None = None
    ) -> tuple[Any, ...]:
        """The service throttled ``task``'s run: its copy sent again claims the kept slot."""
        key = (task, retries)
        self.state, mark, st = schedule.throttle(
            self.state, self.marks.get(key), self.now_us, self.interval_us,
            Backoff(retry_after_us, 1, adapt_max_us, self.burst, self.costs.get(task, 1),
                    self.limits),
            born_us=self.born(),
        )  # fmt: skip
        self._put(key, mark)
        self.granted[key] = (mark.epoch, mark.slot_us) if isinstance(mark, Granted) else (0, 0)
        return ("throttled", st.next_slot_in_us)

    def op_renew(self, task: str, retries: int, holder: str, lease_us: int) -> tuple[str, bool]:
        key = (task, retries)
        mark, renewed = schedule.renew(self.marks.get(key), self.now_us, holder, lease_us)
        self._put(key, mark)
        return ("renewed", renewed)

    def op_pause(self) -> None:
        self.state = schedule.pause(self.state, self.now_us, self.interval_us, born_us=self.born())

    def op_unpause(self) -> None:
        self.state = schedule.unpause(
            self.state, self.now_us, self.interval_us, born_us=self.born()
        )

    def op_set_interval(self, new_interval_us: int) -> None:
        self.state = schedule.set_interval(
            self.state, self.now_us, self.interval_us, new_interval_us, born_us=self.born()
        )

    def op_unset_interval(self) -> tuple[str, bool]:
        self.state, dropped = schedule.unset_interval(self.state, self.interval_us)
        return ("dropped", dropped)

    def op_lose(self) -> None:
        """The store lost everything (a restart without persistence), its birth marker too."""
        self.state = self.born_us = self.reset_us = self.expires_real_us = None
        self.marks.clear()

    def op_lose_state(self) -> None:
        """Only the bucket's record is gone (``reset``): marks of an old epoch remain."""
        self.state = self.expires_real_us = None
        self.reset_us = self.now_us

    def op_expire(self) -> None:
        """The store drops the state if ``expires_in_us`` let it go by now (an idle bucket)."""
        if self.expires_real_us is not None and self.expires_real_us <= self.now_us:
            self.state = self.expires_real_us = None

    def op_status(self) -> tuple[Any, ...]:
        s = schedule.status(self.state, self.now_us, self.interval_us, born_us=self.born(False))
        return ("status", s.ticket, s.next_slot_in_us, s.interval_us, s.paused)

    def op_record(self) -> tuple[Any, ...]:
        """The raw record, times relative to T0: (tat, ticket, current_slot, last_start)."""
        assert self.state is not None
        s = self.state
        return ("record", s.tat_us - T0_US, s.ticket, s.current_slot_us - T0_US,
                s.last_start_us - T0_US)  # fmt: skip

    def op_starts(self) -> tuple[Any, ...]:
        return ("starts", *self.starts_real_us)

    def _put(self, key: tuple[str, int], mark: Mark | None) -> None:
        if mark is None:
            self.marks.pop(key, None)
        else:
            self.marks[key] = mark


def at(t_us: int) -> Step:
    return ("at", t_us)


def grant(task: str, not_before_in_us: int = 0, retries: int = 0) -> Step:
    return ("grant", task, retries, not_before_in_us)


def claim(
    task: str, holder: str = "w1", lead_us: int = 0, retries: int = 0, lease_us: int = 10 * I_US
) -> Step:
    return ("claim", task, retries, holder, lead_us, lease_us)


def done(task: str, retries: int = 0, ttl_us: int = 100 * I_US) -> Step:
    return ("done", task, retries, ttl_us)


def renew(task: str, holder: str, lease_us: int, retries: int = 0) -> Step:
    return ("renew", task, retries, holder, lease_us)


def throttle(
    task: str, retry_after_us: int, retries: int = 0, adapt_max_us: int | None = None
) -> Step:
    return ("throttle", task, retries, retry_after_us, adapt_max_us)


PAUSE: Step = ("pause",)
UNSET: Step = ("unset_interval",)
UNPAUSE: Step = ("unpause",)
LOSE: Step = ("lose",)
STATUS: Step = ("status",)
RECORD: Step = ("record",)
STARTS: Step = ("starts",)


def set_interval(new_interval_us: int) -> Step:
    return ("set_interval", new_interval_us)


#: The tasks and holders of the random operation sequences.
TASKS = ["a", "b", "c", "d"]
HOLDERS = ["w1", "w2", "w3"]

IDLE_US = schedule.IDLE_GRACE_US
