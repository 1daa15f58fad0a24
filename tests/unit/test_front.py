"""Interactive starts in the pure model: ahead of a backlog, within their share, budget exact."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from celery_interval import schedule
from celery_interval.schedule import (
    BucketState,
    Claim,
    ClaimTerms,
    Granted,
    Mark,
    Outcome,
    Pace,
    Slot,
)
from celery_interval.schedule.front import share_spacing

T = 10_000
T0 = 1_800_000_000_000_000
OLD_BORN = T0 - 10**12
TASK = ClaimTerms("worker", 10**9, lead_us=2_000)


def backlog(n: int, burst: int = 1) -> tuple[BucketState, list[schedule.Grant]]:
    """A bucket at T0 with ``n`` tickets granted (a task backlog)."""
    state: BucketState | None = None
    grants = []
    for _ in range(n):
        state, _, g = schedule.grant(state, None, T0, Pace(T, burst=burst), born_us=OLD_BORN)
        grants.append(g)
    assert state is not None
    return state, grants


def inline(share: float | None, cost: int = 1, burst: int = 1) -> Pace:
    return Pace(T, burst=burst, cost=cost, share=share)


def test_without_a_share_an_inline_start_waits_behind_the_backlog() -> None:
    state, grants = backlog(200)
    _, _, g = schedule.grant(state, None, T0, inline(None), born_us=OLD_BORN)
    assert g.slot_us == grants[-1].slot_us + T


def test_with_a_share_it_goes_to_the_front_and_the_tickets_count_it() -> None:
    state, grants = backlog(200)
    after, mark, g = schedule.grant(state, None, T0, inline(0.25, cost=2), born_us=OLD_BORN)
    assert (g.outcome, g.slot_us, g.delay_us) == (Outcome.OK, T0, 0), "the budget's next start"
    assert mark == Granted(g.epoch, 201, T0, T0 + schedule.GRANTED_TTL_US, front=True)
    assert after.reserved_us == T0
    assert after.pushed_us == 2 * T, "every ticket is pushed back by its cost"
    assert (after.tat_us, after.last_slot_us) == (state.tat_us, state.last_slot_us)
    assert after.front_tat_us == T0 + 2 * 4 * T, "two units of the share's interval"
    _, _, later = schedule.grant(after, None, T0, Pace(T), born_us=OLD_BORN)
    assert later.delay_us == grants[-1].delay_us + 3 * T, "a later ticket comes after it too"
    _, _, last = schedule.claim(after, None, T0, T, grants[-1].slot, TASK, born_us=OLD_BORN)
    assert (last.outcome, last.delay_us) == (Outcome.WAIT, grants[-1].delay_us + 2 * T)


def test_a_second_interactive_start_waits_for_its_share_with_no_ticket() -> None:
    state, _ = backlog(50)
    state, _, _ = schedule.grant(state, None, T0, inline(0.25), born_us=OLD_BORN)
    again, _, g = schedule.grant(state, None, T0 + T, inline(0.25), born_us=OLD_BORN)
    assert (g.outcome, g.ticket, g.delay_us) == (Outcome.WAIT, 0, 3 * T)
    assert again == state, "a WAIT changes nothing"
    _, _, g = schedule.grant(state, None, T0 + 4 * T, inline(0.25), born_us=OLD_BORN)
    assert g.outcome is Outcome.OK and g.slot_us == T0 + 4 * T


def test_an_idle_bucket_grants_an_ordinary_ticket_and_spends_no_share() -> None:
    state, mark, g = schedule.grant(None, None, T0, inline(0.25), born_us=OLD_BORN)
    assert isinstance(mark, Granted) and not mark.front
    assert (g.delay_us, state.front_tat_us, state.reserved_us) == (0, None, None)


def test_pushed_tickets_wait_and_are_not_reticketed() -> None:
    """The front start takes the next start; the ticket due then claims WAIT (an interval
    later), not RETICKET; ``current_slot_us`` stays."""
    state, grants = backlog(3)
    copy_slot = grants[0].slot
    state, mark, g = schedule.grant(state, None, T0, inline(0.5), born_us=OLD_BORN)
    state, _, c = schedule.claim(
        state, mark, T0, T, g.slot, ClaimTerms("web", 10**6), born_us=OLD_BORN
    )
    assert c.outcome is Outcome.OK and c.delay_us == 0
    assert (state.current_slot_us, state.reserved_us) == (0, None)
    _, _, task = schedule.claim(state, None, T0, T, copy_slot, TASK, born_us=OLD_BORN)
    assert (task.outcome, task.delay_us) == (Outcome.WAIT, T)
    _, _, task = schedule.claim(state, None, T0 + T, T, grants[1].slot, TASK, born_us=OLD_BORN)
    assert (task.outcome, task.delay_us) == (Outcome.WAIT, T), "the next one keeps its turn"


def test_other_claims_wait_for_the_reserved_front_slot() -> None:
    """Between the front grant and its claim, a ticket due then cannot take its start."""
    state, grants = backlog(3)
    state, _, _ = schedule.grant(state, None, T0, inline(0.5), born_us=OLD_BORN)
    _, _, task = schedule.claim(state, None, T0, T, grants[0].slot, TASK, born_us=OLD_BORN)
    assert (task.outcome, task.delay_us) == (Outcome.WAIT, T)


def test_the_share_interval_rounds_up() -> None:
    assert share_spacing(10_000, 0.3) == math.ceil(10_000 / 0.3) == 33_334
    assert share_spacing(1, 0.999) == 2


# -- a simulated pool: a backlog of tickets and interactive callers on one bucket -----------


@dataclass
class Pool:
    """Tasks claim their granted slots (again after each WAIT); interactive callers take,
    wait, claim, as ``slot()`` does; one model state, events in time order."""

    share: float
    burst: int
    state: BucketState | None = None
    marks: dict[str, Mark | None] = field(default_factory=dict)
    starts: list[tuple[int, int, str]] = field(default_factory=list)  # (start, cost, who)
    waits: dict[str, tuple[int, int]] = field(default_factory=dict)  # caller: (arrival, start)
    events: list[tuple[int, int, str, Slot | None]] = field(default_factory=list)
    fronted: set[str] = field(default_factory=set)  # the callers whose start went ahead
    seq: int = 0

    def at(self, t_us: int, who: str, slot: Slot | None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t_us, self.seq, who, slot))

    def claimed(self, now_us: int, who: str, slot: Slot, c: Claim, lead_us: int) -> None:
        assert c.outcome is not Outcome.RETICKET, f"{who} lost its ticket"
        if c.outcome is Outcome.OK:
            self.starts.append((now_us + c.delay_us, self.cost(who), who))
        else:
            assert c.outcome is Outcome.WAIT
            self.at(now_us + max(0, c.delay_us - lead_us), who, slot)

    def cost(self, who: str) -> int:
        return 1 if who.startswith("t") else min(2, self.burst) if who.endswith("!") else 1

    def run(self, tasks: int, callers: list[int]) -> None:
        for i in range(tasks):
            self.state, self.marks[f"t{i}"], g = schedule.grant(
                self.state, None, T0, Pace(T, burst=self.burst), born_us=OLD_BORN
            )
            self.at(g.slot_us - TASK.lead_us, f"t{i}", g.slot)
        for i, arrival in enumerate(callers):
            who = f"web{i}" + ("!" if i % 3 == 2 else "")
            self.waits[who] = (T0 + arrival, 0)
            self.at(T0 + arrival, who, None)
        while self.events:
            now, _, who, slot = heapq.heappop(self.events)
            self.step(now, who, slot)

    def step(self, now: int, who: str, slot: Slot | None) -> None:
        if who.startswith("t"):
            assert slot is not None
            terms = ClaimTerms("worker", 10**9, lead_us=TASK.lead_us, burst=self.burst)
            self.state, self.marks[who], c = schedule.claim(
                self.state, self.marks[who], now, T, slot, terms, born_us=OLD_BORN
            )
            self.claimed(now, who, slot, c, TASK.lead_us)
            return
        terms = ClaimTerms(who, 10**9, lead_us=500, burst=self.burst, cost=self.cost(who))
        if slot is None:
            pace = Pace(T, burst=self.burst, cost=self.cost(who), share=self.share)
            share_tat_us = None if self.state is None else self.state.front_tat_us
            self.state, self.marks[who], g, c = schedule.take(
                self.state, self.marks.get(who), now, pace, terms, born_us=OLD_BORN
            )
            if self.state.front_tat_us != share_tat_us:
                self.fronted.add(who)
            if g.outcome is Outcome.WAIT:
                self.at(now + g.delay_us, who, None)
            elif c is None:
                self.at(now + max(0, g.delay_us - 500), who, g.slot)
            else:
                self.claimed(now, who, g.slot, c, 500)
            return
        self.state, self.marks[who], c = schedule.claim(
            self.state, self.marks[who], now, T, slot, terms, born_us=OLD_BORN
        )
        self.claimed(now, who, slot, c, 500)


def assert_budget(starts: list[tuple[int, int, str]], burst: int, interval_us: int) -> None:
    """Every window of starts: Σ cost <= burst + span / interval."""
    ordered = sorted(starts)
    for i, (first, _, _) in enumerate(ordered):
        used = 0
        for last, cost, _ in ordered[i:]:
            used += cost
            assert used * interval_us <= burst * interval_us + (last - first), (first, last)


@settings(max_examples=150, deadline=None)
@given(
    share=st.sampled_from([0.1, 0.25, 0.5, 0.9]),
    burst=st.sampled_from([1, 1, 3]),
    tasks=st.integers(20, 120),
    callers=st.lists(st.integers(0, 150 * T), max_size=12),
)
def test_a_backlog_and_random_interactive_callers(
    share: float, burst: int, tasks: int, callers: list[int]
) -> None:
    """Under a backlog of tickets and interactive callers at random times: no ticket is lost
    and tickets start in order; every start keeps the budget; the starts that went ahead keep
    the share's GCRA; such a caller waits at most a share interval and an interval per unit
    of each interactive start from its arrival to its own; and no budget is wasted: while
    tickets wait, the starts come one per interval."""
    pool = Pool(share, burst)
    pool.run(tasks, sorted(callers))
    task_starts = [(int(w[1:]), s) for s, _, w in pool.starts if w.startswith("t")]
    assert len(task_starts) == tasks
    assert [s for _, s in sorted(task_starts)] == sorted(s for _, s in task_starts), "FIFO"
    assert_budget(pool.starts, burst, T)
    callers_starts = [(s, c, w) for s, c, w in pool.starts if not w.startswith("t")]
    assert len(callers_starts) == len(callers)
    spacing = share_spacing(T, share)
    front_starts = [(s, c, w) for s, c, w in callers_starts if w in pool.fronted]
    assert_budget(front_starts, 2, spacing)  # the share's GCRA: burst 1, a cost up to 2
    for start, cost, who in front_starts:
        arrival = pool.waits[who][0]
        # the interactive starts ahead of it, and the share still owed for the one before
        ahead = [c for s, c, w in front_starts if arrival - 2 * spacing <= s < start]
        assert start - arrival <= sum(c * (spacing + T) for c in [*ahead, cost]) + 500, who
    last_task = max(s for _, s in task_starts)
    units = sum(c for s, c, _ in pool.starts if s <= last_task)
    assert last_task - T0 <= (units - 1) * T + T, "while tickets wait, one start per interval"


def _pushed_far() -> tuple[BucketState, int]:
    """40 tickets, 30 interactive starts ahead of them, then every ticket started: ticket
    time lies 30 intervals behind virtual time and no ticket waits. Returns it and now."""
    state, grants = backlog(40)
    now = T0
    for _ in range(30):
        state, mark, g = schedule.grant(state, None, now, inline(0.999), born_us=OLD_BORN)
        assert isinstance(mark, Granted) and mark.front
        state, _, c = schedule.claim(state, mark, now, T, g.slot, TASK, born_us=OLD_BORN)
        assert c.outcome is Outcome.OK
        now += 2 * T
    for g in grants:
        c = Claim(Outcome.WAIT, 0, 0, 0)
        while c.outcome is Outcome.WAIT:
            now += c.delay_us
            state, _, c = schedule.claim(state, None, now, T, g.slot, TASK, born_us=OLD_BORN)
        assert c.outcome is Outcome.OK, c
    assert state.pushed_us == 30 * T and state.current_slot_us == state.last_slot_us
    return state, now + 10 * T


def test_a_fence_and_a_throttle_count_the_tickets_in_virtual_time() -> None:
    """The fence and the throttle set the grants' time from the starts: in virtual time, so
    a later ticket is not held back by the pushes on top."""
    state, now = _pushed_far()
    fenced = schedule.fenced(state, now, T)
    _, _, g = schedule.grant(fenced, None, now, Pace(T), born_us=OLD_BORN)
    assert g.delay_us == schedule.MAX_LEAD_US + T, "one interval after the fence's lead"
    backoff = schedule.Backoff(5 * T, ticket=9)
    throttled, _, _ = schedule.throttle(state, None, now, T, backoff, born_us=OLD_BORN)
    _, _, g = schedule.grant(throttled, None, now, Pace(T), born_us=OLD_BORN)
    assert g.delay_us == 6 * T, "after the throttle's wait and the kept slot"


def test_a_grant_while_no_ticket_waits_folds_the_pushes_back() -> None:
    state, now = _pushed_far()
    state, _, g = schedule.grant(state, None, now, Pace(T), born_us=OLD_BORN)
    assert (g.delay_us, g.slot_us, state.pushed_us) == (0, now, 0), "virtual time again"


def test_a_ticket_sharing_the_started_slot_still_starts_after_the_fold() -> None:
    """Burst 2: two tickets share a slot; an interactive start pushes both; one starts, a
    grant folds the pushes back, and the other still starts (not re-ticketed)."""
    state, grants = backlog(2, burst=2)
    assert grants[0].slot_us == grants[1].slot_us
    state, mark, g = schedule.grant(state, None, T0, inline(0.5, burst=2), born_us=OLD_BORN)
    web = ClaimTerms("web", 10**6, burst=2)
    state, _, c = schedule.claim(state, mark, T0, T, g.slot, web, born_us=OLD_BORN)
    assert c.outcome is Outcome.OK
    terms = ClaimTerms("worker", 10**9, lead_us=2_000, burst=2)
    now = T0 + 5 * T
    state, _, first = schedule.claim(state, None, now, T, grants[0].slot, terms, born_us=OLD_BORN)
    assert first.outcome is Outcome.OK and state.pushed_us == T
    state, _, _ = schedule.grant(state, None, now, Pace(T, burst=2), born_us=OLD_BORN)
    assert state.pushed_us == 0
    _, _, second = schedule.claim(state, None, now, T, grants[1].slot, terms, born_us=OLD_BORN)
    assert second.outcome is Outcome.OK, second
