"""One contract, three stores: Redis (real server), file (fcntl), memory.

Every store runs on a clock the test moves (``Clock``; Redis scripts take its time instead of
Redis TIME): a wait is a move of the clock, so how fast the machine runs changes nothing. One
test (``test_on_the_stores_own_clocks_slots_follow_and_a_due_claim_starts``) keeps each store's
own clock (Redis TIME, the wall clock, monotonic), asserting only orderings and lower bounds.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from celery_interval.errors import StoreUnavailable
from celery_interval.schedule import (
    MARKS_SETTLE_US,
    MAX_LEAD_US,
    PLACE_POLL_US,
    PLACE_SETTLE_US,
    Claim,
    ClaimTerms,
    Grant,
    Limit,
    Outcome,
    Pace,
)
from celery_interval.stores.base import Store, TaskCopy
from celery_interval.stores.file import FileStore
from celery_interval.stores.memory import MemoryStore
from celery_interval.stores.redis import RedisStore
from tests.helpers.fakeclock import Clock

I_US = 40_000
LEASE_US = 60_000_000
START_US = 1_700_000_000_000_000  # a realistic epoch time: nothing sits near 0
PAST_US = 2_000  # a wait ends this far past the instant it names (a sleep oversleeps)
LANDED_S = 30.0  # how long a posted done mark may take to land, on however loaded a machine


@pytest.fixture
def clock() -> Clock:
    return Clock(START_US)


@pytest.fixture(params=["redis", "file", "memory"])
def store(request: Any, tmp_path: Path, clock: Clock) -> Iterator[Store]:
    """A store on ``clock``: replies and reads compare exactly."""
    if request.param == "redis":
        redis_store = RedisStore(request.getfixturevalue("redis_client"), now_us=clock)
        try:
            yield redis_store
        finally:
            redis_store.close()
    elif request.param == "file":
        (tmp_path / "state").mkdir()
        yield FileStore(tmp_path / "state", clock_us=clock)
    else:
        yield MemoryStore(clock_us=clock)


def wait(clock: Clock, delay_us: int) -> None:
    """Move ``clock`` just past ``delay_us`` from now."""
    clock.now_us += max(0, delay_us) + PAST_US


def landed(store: Store, copy: TaskCopy) -> bool:
    """Whether a done mark posted for ``copy`` lands (its reply is not awaited): read the owed
    replies (a call that met NOSCRIPT or a lost connection is sent again) until a grant of the
    copy is a DUPLICATE, for up to LANDED_S (a grant of a copy holding a ticket takes none)."""
    deadline = time.monotonic() + LANDED_S
    while True:
        store.prepare_post()
        if store.grant(copy, Pace(I_US)).outcome is Outcome.DUPLICATE:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def test_tickets_and_slots_follow_one_another(store: Store) -> None:
    grants = [store.grant(TaskCopy("b", f"t{i}", 0), Pace(I_US)) for i in range(5)]
    assert [g.ticket for g in grants] == [1, 2, 3, 4, 5]
    assert all(g.outcome is Outcome.OK and g.epoch == grants[0].epoch for g in grants)
    slots = [g.slot_us for g in grants]
    assert [b - a for a, b in itertools.pairwise(slots)] == [I_US] * 4
    assert grants[0].delay_us == I_US + MAX_LEAD_US, "a new epoch waits one interval"


def test_claims_wait_for_their_slot_then_start(store: Store, clock: Clock) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    early = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US))
    assert early.outcome is Outcome.WAIT and early.delay_us == g.delay_us
    wait(clock, early.delay_us - 18_000)  # claim up to MAX_LEAD_US early: the start is ahead
    ok = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US, MAX_LEAD_US))
    assert ok.outcome is Outcome.OK and ok.delay_us == 18_000 - PAST_US
    assert ok.now_us + ok.delay_us == g.slot_us, "it starts at its slot"
    again = store.claim(
        TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US, MAX_LEAD_US)
    )
    assert again.outcome is Outcome.OK, "a claim is idempotent for its holder"
    assert again.now_us + again.delay_us == ok.now_us + ok.delay_us, "the same start"
    other = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h2", LEASE_US))
    assert other.outcome is Outcome.HELD and 0 < other.delay_us <= LEASE_US
    wait(clock, ok.delay_us)  # the admitted start passes unheard (as if the OK reply were lost)
    late = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US))
    assert (late.outcome, late.delay_us) == (Outcome.OK, 0), "no start since: it moves to now"
    assert late.now_us == ok.now_us + ok.delay_us + PAST_US


def test_done_makes_copies_duplicates_but_not_retries(store: Store, clock: Clock) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    wait(clock, g.delay_us)
    assert (
        store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US)).outcome
        is Outcome.OK
    )
    store.done([TaskCopy("b", "t1", 0)], 60_000_000)
    assert store.grant(TaskCopy("b", "t1", 0), Pace(I_US)).outcome is Outcome.DUPLICATE
    claim = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h2", LEASE_US))
    assert claim.outcome is Outcome.DUPLICATE
    assert store.grant(TaskCopy("b", "t1", 1), Pace(I_US)).outcome is Outcome.OK


def test_a_posted_done_mark_makes_copies_duplicates(store: Store, clock: Clock) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    wait(clock, g.delay_us)
    assert (
        store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US)).outcome
        is Outcome.OK
    )
    store.prepare_post()
    store.post_done(TaskCopy("b", "t1", 0), 60_000_000)
    assert landed(store, TaskCopy("b", "t1", 0)), "posted on a connection of its own"
    assert store.grant(TaskCopy("b", "t1", 1), Pace(I_US)).outcome is Outcome.OK


def test_lease_expiry_lets_a_copy_run_and_renew_extends(store: Store, clock: Clock) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    wait(clock, g.delay_us)
    short_us = 600_000
    assert (
        store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", short_us)).outcome
        is Outcome.OK
    )
    assert store.renew("b", "t1", 0, "h1", short_us) is True
    assert store.renew("b", "t1", 0, "h2", short_us) is False
    g2 = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    held = store.claim(TaskCopy("b", "t1", 0), I_US, g2.slot, ClaimTerms("h2", LEASE_US))
    assert held.outcome in (Outcome.HELD, Outcome.WAIT)
    wait(clock, max(short_us, g2.delay_us))
    ok = store.claim(TaskCopy("b", "t1", 0), I_US, g2.slot, ClaimTerms("h2", LEASE_US))
    assert ok.outcome is Outcome.OK


def test_pause_holds_every_start_and_unpause_shifts_slots(store: Store, clock: Clock) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    paused = store.pause("b", I_US)
    assert paused.paused and paused.exists
    wait(clock, g.delay_us)
    claim = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US))
    assert claim.outcome is Outcome.PAUSED
    g2 = store.grant(TaskCopy("b", "t2", 0), Pace(I_US))
    assert g2.paused and g2.slot_us == g.slot_us + I_US
    resumed = store.unpause("b", I_US)
    assert not resumed.paused
    first = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US))
    assert first.outcome is Outcome.WAIT, "the pause shifted the slot by its own length"
    assert first.delay_us == g.delay_us, "so the wait left is the one the pause began with"
    wait(clock, first.delay_us)
    assert (
        store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US)).outcome
        is Outcome.OK
    )


def test_set_interval_and_status(store: Store) -> None:
    assert store.status("fresh", I_US).exists is False
    store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    st = store.set_interval("b", I_US, 2 * I_US)
    assert st.interval_us == 2 * I_US and st.overridden
    assert store.status("b", I_US).interval_us == 2 * I_US
    g1, g2 = (
        store.grant(TaskCopy("b", "t2", 0), Pace(I_US)),
        store.grant(TaskCopy("b", "t3", 0), Pace(I_US)),
    )
    assert g2.slot_us - g1.slot_us == 2 * I_US


def test_unset_interval_goes_back_to_the_configured_interval(store: Store) -> None:
    none = store.unset_interval("fresh", I_US)
    assert not none.dropped and not none.status.exists, "no state: nothing made"
    assert store.status("fresh", I_US).exists is False
    g1 = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    assert store.unset_interval("b", I_US).dropped is False, "no override: nothing to drop"
    store.set_interval("b", I_US, 3 * I_US)
    store.pause("b", I_US)
    unset = store.unset_interval("b", I_US)
    assert unset.dropped and not unset.status.overridden and unset.status.interval_us == I_US
    assert unset.status.paused and unset.status.epoch == g1.epoch and unset.status.ticket == 1
    after = store.status("b", I_US)
    assert (after.overridden, after.interval_us, after.paused) == (False, I_US, True)
    assert store.unset_interval("b", I_US).dropped is False, "dropped once only"
    g2, g3 = (store.grant(TaskCopy("b", f"t{i}", 0), Pace(I_US)) for i in (2, 3))
    assert (g2.ticket, g3.ticket) == (2, 3) and g2.epoch == g1.epoch, "no new epoch"
    assert g2.slot_us - g1.slot_us == 3 * I_US, "the tat the override pushed is kept"
    assert g3.slot_us - g2.slot_us == I_US, "new grants are spaced by the configured interval"


def _settled(store: Store, clock: Clock) -> None:
    """Let the store's birth marker age past PLACE_SETTLE_US: capped claims no longer wait for
    running bodies to take back places a lost store forgot."""
    store.grant(TaskCopy("warm", "w", 0), Pace(I_US))
    wait(clock, PLACE_SETTLE_US)


def _claim_due(store: Store, clock: Clock, copy: TaskCopy, terms: ClaimTerms) -> Any:
    """Grant ``copy`` and claim it at its slot, waiting as the store says (not when FULL)."""
    g = store.grant(copy, Pace(I_US))
    while True:
        claimed = store.claim(copy, I_US, g.slot, terms)
        if claimed.outcome is not Outcome.WAIT:
            return claimed
        wait(clock, claimed.delay_us)


def test_a_capped_bucket_runs_at_most_cap_bodies_and_a_release_frees_a_place(
    store: Store, clock: Clock
) -> None:
    _settled(store, clock)
    terms = ClaimTerms("h1", LEASE_US, cap=2)
    a, b, c = (TaskCopy("b", f"t{i}", 0) for i in range(3))
    assert _claim_due(store, clock, a, terms).outcome is Outcome.OK
    assert _claim_due(store, clock, b, terms).outcome is Outcome.OK
    full = _claim_due(store, clock, c, terms)
    assert full.outcome is Outcome.FULL and 0 < full.delay_us <= PLACE_POLL_US
    assert store.status("b", I_US).running == 2
    assert store.renew_place(a, LEASE_US) and not store.renew_place(c, LEASE_US)
    store.reset("b")  # a reset frees no place
    assert store.status("b", I_US).running == 2
    assert store.release(a) and not store.release(a)
    assert store.status("b", I_US).running == 1
    assert _claim_due(store, clock, c, terms).outcome is Outcome.OK
    d = TaskCopy("b", "t3", 0)
    assert _claim_due(store, clock, d, terms).outcome is Outcome.FULL


def test_a_place_not_renewed_comes_back_when_it_expires(store: Store, clock: Clock) -> None:
    _settled(store, clock)
    place_us = 60_000
    short = ClaimTerms("h1", LEASE_US, cap=1, place_us=place_us)
    a, b = TaskCopy("b", "t1", 0), TaskCopy("b", "t2", 0)
    assert _claim_due(store, clock, a, short).outcome is Outcome.OK
    started_us = clock.now_us
    full = _claim_due(store, clock, b, short)
    assert full.outcome is Outcome.FULL
    assert clock.now_us - started_us == I_US + PAST_US < place_us, "b came while a's place held"
    clock.now_us += 70_000
    assert clock.now_us > started_us + place_us
    assert store.status("b", I_US).running == 0, "an expired place is not counted"
    assert _claim_due(store, clock, b, short).outcome is Outcome.OK
    assert not store.renew_place(a, LEASE_US)


def test_a_new_store_lets_running_bodies_take_back_their_places_first(
    store: Store, clock: Clock
) -> None:
    """A store that lost its records forgot the places of bodies still running: for
    PLACE_SETTLE_US after its birth a capped claim holding no place is FULL, while a running
    body's renewal takes its place back (under the cap, never past it)."""
    terms = ClaimTerms("h1", LEASE_US, cap=1)
    a, running, other = TaskCopy("b", "a", 0), TaskCopy("b", "run", 0), TaskCopy("b", "x", 0)
    born_us = clock.now_us
    g = store.grant(a, Pace(I_US))  # the store is born here
    wait(clock, g.delay_us)
    first = store.claim(a, I_US, g.slot, terms)
    assert first.outcome is Outcome.FULL
    assert first.delay_us == born_us + PLACE_SETTLE_US - clock.now_us, first
    assert store.renew_place(running, LEASE_US, cap=1), "a running body takes its place back"
    assert not store.renew_place(other, LEASE_US, cap=1), "never past the cap"
    assert store.status("b", I_US).running == 1
    wait(clock, first.delay_us)
    assert store.claim(a, I_US, g.slot, terms).outcome is Outcome.FULL, "the cap is full"
    assert store.release(running)
    assert store.claim(a, I_US, g.slot, terms).outcome is Outcome.OK


def test_reset_starts_a_new_epoch_and_old_tickets_reticket(store: Store, clock: Clock) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    store.reset("b")
    wait(clock, g.delay_us)
    claim = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US))
    assert claim.outcome is Outcome.RETICKET and claim.epoch != g.epoch
    assert store.grant(TaskCopy("b", "t1", 0), Pace(I_US)).ticket == 1


def test_buckets_are_independent(store: Store) -> None:
    store.pause("a", I_US)
    assert store.status("a", I_US).paused and not store.status("b", I_US).paused
    assert store.grant(TaskCopy("b", "t", 0), Pace(I_US)).ticket == 1


def test_a_redelivered_copy_gets_its_ticket_and_slot_again(store: Store) -> None:
    first = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    store.grant(TaskCopy("b", "t2", 0), Pace(I_US))
    copy = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    assert (copy.ticket, copy.slot_us, copy.epoch) == (first.ticket, first.slot_us, first.epoch)
    assert store.grant(TaskCopy("b", "t3", 0), Pace(I_US)).ticket == 3, (
        "the copy took no ticket of its own"
    )
    assert store.status("b", I_US).ticket == 3


def test_posting_to_a_hung_redis_returns_at_once_and_lands_later() -> None:
    """A pool process posts its task's done mark as the body starts: a hung store (SIGSTOP)
    must not hold the start back, and the mark is applied once the store runs again. Replies
    owed meanwhile are read by the next prepare; flushed scripts are sent again; a connection
    the server closed is replaced by the next prepare.

    On Redis TIME and real time (a hung server is what it tests): posting must end well
    within the store's socket timeout, which a post waiting on the hung server would reach,
    and each mark is awaited (``landed``) rather than given a fixed time to land."""
    import signal

    import redis

    from celery_interval.demo.embedded import RedisProc

    timeout_s = 30.0

    def post(task: str) -> None:
        hung.prepare_post()
        hung.post_done(TaskCopy("b", task, 0), 60_000_000)

    server = RedisProc()
    admin = redis.Redis.from_url(server.url)
    try:
        hung = RedisStore.from_url(server.url, socket_timeout_s=timeout_s)
        hung.prepare_post()
        proc: Any = server.proc
        proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            for i in range(3):
                hung.post_done(TaskCopy("b", f"t{i}", 0), 60_000_000)
            posting_s = time.monotonic() - started
        finally:
            proc.send_signal(signal.SIGCONT)
        assert posting_s < timeout_s / 3, f"posting to a hung store took {posting_s:.2f}s"
        assert landed(hung, TaskCopy("b", "t0", 0)) and landed(hung, TaskCopy("b", "t2", 0))
        admin.script_flush()  # as after a restart: no scripts
        post("t3")  # meets NOSCRIPT; a later prepare reads that and sends it again
        post("t4")
        assert landed(hung, TaskCopy("b", "t3", 0)) and landed(hung, TaskCopy("b", "t4", 0))
        admin.client_kill_filter(skipme=True)  # the server closes every other connection
        post("t5")
        assert landed(hung, TaskCopy("b", "t5", 0))
    finally:
        admin.close()
        server.stop()


def test_a_mark_posted_on_a_connection_the_store_cut_is_settled_as_the_body_ends() -> None:
    """The store cut the posting connection (CLIENT KILL) just before the post: the write went
    nowhere, with no error. As the body ends, ``settle_post`` reads that, and sends the mark
    again on a new connection: another worker's grant finds it at once, with no later task of
    the posting process (which a killed worker never runs)."""
    import redis

    from celery_interval.demo.embedded import RedisProc

    server = RedisProc()
    admin = redis.Redis.from_url(server.url)
    try:
        posting = RedisStore.from_url(server.url)
        other = RedisStore.from_url(server.url)
        copy = TaskCopy("b", "cut", 0)
        posting.prepare_post()
        admin.client_kill_filter(skipme=True)
        posting.post_done(copy, 60_000_000)
        posting.settle_post(5.0)
        assert other.grant(copy, Pace(I_US)).outcome is Outcome.DUPLICATE
    finally:
        admin.close()
        server.stop()


def test_a_mark_owed_while_the_store_was_out_of_reach_is_settled_as_the_body_ends() -> None:
    """The store was down as the pool process prepared the mark's connection (its body starts
    anyway): the mark is owed, and ``settle_post`` as the body ends tries to reach the store
    until it answers, within its timeout, so another worker's grant finds the mark."""
    import threading

    from celery_interval.demo.embedded import RedisProc

    server = RedisProc()
    try:
        posting = RedisStore.from_url(server.url)
        copy = TaskCopy("b", "owed", 0)
        server.kill()
        with pytest.raises(StoreUnavailable):
            posting.prepare_post()
        posting.post_done(copy, 60_000_000)
        back = threading.Timer(0.3, server.restart)
        back.start()
        posting.settle_post(10.0)
        back.join()
        other = RedisStore.from_url(server.url)
        assert other.grant(copy, Pace(I_US)).outcome is Outcome.DUPLICATE
    finally:
        server.stop()


def test_a_bucket_made_once_the_store_is_an_interval_old_starts_at_once(
    store: Store, clock: Clock
) -> None:
    first = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    assert first.delay_us == I_US + MAX_LEAD_US, "a new store may have lost a start"
    wait(clock, I_US + MAX_LEAD_US)
    taken, claimed = store.take(
        TaskCopy("c", "t1", 0), Pace(I_US), ClaimTerms("h1", LEASE_US, MAX_LEAD_US)
    )
    assert taken.delay_us == 0 and claimed is not None and claimed.outcome is Outcome.OK
    store.reset("c")
    again = store.grant(TaskCopy("c", "t2", 0), Pace(I_US))
    assert again.delay_us == I_US + MAX_LEAD_US, "a reset keeps the first wait"


def test_a_burst_starts_back_to_back_after_an_idle_spell_then_one_per_interval(
    store: Store, clock: Clock
) -> None:
    """burst 3: a new store counts its burst as used at its birth; once the budget has come
    back, three starts come at once, and the fourth an interval after them (here a cost of 2
    and two of 1 spend 4 units: the fourth waits for one more)."""
    first = store.grant(TaskCopy("b", "t0", 0), Pace(I_US, burst=3))
    assert first.delay_us == I_US + MAX_LEAD_US, "a new store: no burst yet"
    wait(clock, first.delay_us + 4 * I_US)  # idle: the whole budget is back
    costs = {"t1": 2, "t2": 1, "t3": 1}
    grants = {t: store.grant(TaskCopy("b", t, 0), Pace(I_US, 0, 3, c)) for t, c in costs.items()}
    assert [g.delay_us for g in grants.values()][:2] == [0, 0]
    claims = {
        t: store.claim(
            TaskCopy("b", t, 0),
            I_US,
            grants[t].slot,
            ClaimTerms("h1", LEASE_US, 0, 0, burst=3, cost=c),
        )
        for t, c in costs.items()
    }
    assert [c.outcome for c in claims.values()] == [Outcome.OK, Outcome.OK, Outcome.WAIT]
    assert 0 < claims["t3"].delay_us <= I_US
    assert store.status("b", I_US).ticket == 4


def test_several_limits_hold_at_once(store: Store, clock: Clock) -> None:
    """The interval I_US and a limit of 2 per 5 intervals (burst 2): after an idle spell two
    start back to back at the interval, the third waits until the limit's budget is back."""
    limits = (Limit(5 * I_US // 2, 2),)
    first = store.grant(TaskCopy("l", "t0", 0), Pace(I_US, limits=limits))
    clock.now_us += first.delay_us + 6 * I_US  # idle: every budget is back
    grants = [store.grant(TaskCopy("l", f"t{i}", 0), Pace(I_US, limits=limits)) for i in (1, 2, 3)]
    offsets_us = [g.slot_us - grants[0].slot_us for g in grants]
    assert offsets_us == [0, I_US, 5 * I_US // 2]
    terms = ClaimTerms("h1", LEASE_US, 0, 0, limits=limits)
    clock.now_us += grants[0].delay_us
    claimed = store.claim(TaskCopy("l", "t1", 0), I_US, grants[0].slot, terms)
    assert claimed.outcome is Outcome.OK
    clock.now_us = grants[1].slot_us
    assert store.claim(TaskCopy("l", "t2", 0), I_US, grants[1].slot, terms).outcome is Outcome.OK
    late = store.claim(TaskCopy("l", "t3", 0), I_US, grants[2].slot, terms)
    assert late.outcome is Outcome.WAIT
    assert late.delay_us == grants[2].slot_us - clock.now_us == 3 * I_US // 2


def test_control_replies_read_the_budgets_as_status_does(store: Store, clock: Clock) -> None:
    """A bucket with a burst of 3 and a limit of 2 per 2 intervals: with the bucket's pace,
    the reply of pause, set_interval, unset_interval and unpause is the status read right
    after it: the slot a ticket would get now (here at once, one unit of each budget spent)
    and each budget's units left, not the time every budget is full again."""
    pace = Pace(I_US, burst=3, limits=(Limit(2 * I_US, 2),))
    fresh = store.unset_interval("fresh", I_US, pace).status
    assert fresh == store.status("fresh", I_US, pace)
    store.grant(TaskCopy("b", "t0", 0), pace)
    clock.now_us += 10 * I_US  # idle: every budget is back
    assert store.grant(TaskCopy("b", "t1", 0), pace).delay_us == 0
    clock.now_us += I_US // 4
    paused = store.pause("b", I_US, pace)
    assert (paused.paused, paused.next_slot_in_us, paused.units_left) == (True, 0, (2, 1))
    replies = {
        "pause": lambda: paused,
        "set_interval": lambda: store.set_interval("b", I_US, 2 * I_US, pace),
        "unset_interval": lambda: store.unset_interval("b", I_US, pace).status,
        "unpause": lambda: store.unpause("b", I_US, pace),
    }
    for op, reply_of in replies.items():
        reply = reply_of()
        read = store.status("b", I_US, pace)
        assert reply == read, op
        assert len(reply.units_left) == 2, op
        clock.now_us += I_US // 3


def test_control_replies_count_the_running_bodies(store: Store, clock: Clock) -> None:
    """Two bodies of a bucket capped at 2 run: the reply of each control operation counts
    them as ``status`` does, and one fewer after one's place is released."""
    store.grant(TaskCopy("warm", "w", 0), Pace(I_US))  # the store's birth marker
    clock.now_us += PLACE_SETTLE_US + I_US
    terms = ClaimTerms("h1", LEASE_US, cap=2)
    bodies = [TaskCopy("b", f"t{i}", 0) for i in range(2)]
    for copy in bodies:
        granted = store.grant(copy, Pace(I_US))
        clock.now_us += granted.delay_us
        assert store.claim(copy, I_US, granted.slot, terms).outcome is Outcome.OK
    replies = {
        "pause": store.pause("b", I_US),
        "set_interval": store.set_interval("b", I_US, 2 * I_US),
        "unset_interval": store.unset_interval("b", I_US).status,
        "unpause": store.unpause("b", I_US),
    }
    assert {op: reply.running for op, reply in replies.items()} == dict.fromkeys(replies, 2)
    assert store.release(bodies[0])
    assert store.pause("b", I_US).running == store.status("b", I_US).running == 1


# ---------------------------------------------------------------------------------------
# The stores' own clocks: only what no machine load can change.
# ---------------------------------------------------------------------------------------

LONG_US = 60_000_000  # no slot of it is crossed, however slow the machine
SHORT_US = 1_000


@pytest.fixture(params=["redis", "file", "memory"])
def own_clock_store(request: Any, tmp_path: Path) -> Iterator[Store]:
    """A store on its own clock: Redis TIME, the wall clock, monotonic."""
    if request.param == "redis":
        yield request.getfixturevalue("redis_store")
    elif request.param == "file":
        (tmp_path / "state").mkdir()
        yield FileStore(tmp_path / "state")
    else:
        yield MemoryStore()


def test_on_the_stores_own_clocks_slots_follow_and_a_due_claim_starts(
    own_clock_store: Store,
) -> None:
    """Slots of a long interval follow one another exactly and are ahead; a claim before its
    slot waits no longer than the grant said; a claim of a short interval's ticket, waited
    for as the store says, starts no earlier than its slot (a sleep only oversleeps, so a
    loaded machine can only make the start later, which is allowed)."""
    store = own_clock_store
    grants = [store.grant(TaskCopy("long", f"t{i}", 0), Pace(LONG_US)) for i in range(3)]
    assert [g.ticket for g in grants] == [1, 2, 3]
    assert [b.slot_us - a.slot_us for a, b in itertools.pairwise(grants)] == [LONG_US] * 2
    assert grants[0].delay_us >= LONG_US, "a new store waits an interval"
    early = store.claim(
        TaskCopy("long", "t0", 0), LONG_US, grants[0].slot, ClaimTerms("h1", LEASE_US)
    )
    assert early.outcome is Outcome.WAIT and 0 < early.delay_us <= grants[0].delay_us
    assert early.now_us + early.delay_us == grants[0].slot_us

    copy = TaskCopy("short", "t0", 0)
    g = store.grant(copy, Pace(SHORT_US))
    claims: list[Claim] = []
    while not claims or claims[-1].outcome is Outcome.WAIT:
        if claims:
            time.sleep(claims[-1].delay_us / 1e6)
        claims.append(store.claim(copy, SHORT_US, g.slot, ClaimTerms("h1", LEASE_US)))
    ok = claims[-1]
    assert ok.outcome is Outcome.OK and ok.delay_us == 0 and ok.now_us >= g.slot_us
    assert store.status("short", SHORT_US).last_start_us >= g.slot_us


def four_granted_the_first_claimed(
    store: Store, clock: Clock
) -> tuple[list[TaskCopy], list[Grant], int]:
    """Four tasks of bucket api granted, the first claimed at its slot: the copies, their
    grants, and the store's birth its claim carried."""
    copies = [TaskCopy("api", f"t{i}", 0) for i in (1, 2, 3, 4)]
    grants = [store.grant(c, Pace(I_US)) for c in copies]
    wait(clock, grants[0].delay_us)
    first = store.claim(copies[0], I_US, grants[0].slot, ClaimTerms("w1", LEASE_US))
    assert first.outcome is Outcome.OK and first.born_us is not None
    return copies, grants, first.born_us


def test_a_claimer_that_saw_an_earlier_birth_holds_new_starts_for_the_marks_to_settle(
    store: Store, clock: Clock
) -> None:
    """A claimer that saw another birth (the store lost its state since) opens the done marks'
    settle window when it comes, however long after the birth: for MARKS_SETTLE_US from then
    every new start waits, whoever claims it; later arrivals of such claimers lengthen it."""
    (_, c2, c3, c4), (g1, g2, g3, g4), born_us = four_granted_the_first_claimed(store, clock)
    knew_this = ClaimTerms("w2", LEASE_US, knew_born_us=born_us)
    wait(clock, g2.slot_us - g1.slot_us)
    assert store.claim(c2, I_US, g2.slot, knew_this).outcome is Outcome.OK
    clock.now_us = born_us + 10 * MARKS_SETTLE_US  # long after the birth: the broker was down
    opened_us = clock.now_us
    earlier = ClaimTerms("w3", LEASE_US, knew_born_us=born_us - 10**9)
    held = store.claim(c3, I_US, g3.slot, earlier)
    assert (held.outcome, held.born_us, held.delay_us) == (Outcome.WAIT, born_us, MARKS_SETTLE_US)
    clock.now_us += MARKS_SETTLE_US // 2
    others = store.claim(c4, I_US, g4.slot, replace(knew_this, holder="w4"))
    assert (others.outcome, others.delay_us) == (Outcome.WAIT, MARKS_SETTLE_US // 2)
    late = store.claim(c4, I_US, g4.slot, replace(earlier, holder="w5"))
    assert (late.outcome, late.delay_us) == (Outcome.WAIT, MARKS_SETTLE_US)
    clock.now_us = opened_us + MARKS_SETTLE_US // 2 + MARKS_SETTLE_US
    assert store.claim(c3, I_US, g3.slot, knew_this).outcome is Outcome.OK


def test_a_redelivered_message_claimed_soon_after_the_birth_holds_new_starts_until_it_settles(
    store: Store, clock: Clock
) -> None:
    """A message delivered before may have run under a birth the store lost, remembered by a
    worker that has not come back yet, while its claimer (started since) saw no earlier birth:
    its claim within MARKS_SETTLE_US of the birth holds every new start until that long after
    the birth. A first delivery opens nothing, nor a redelivery later than that."""
    (_, c2, c3, c4), (g1, g2, g3, g4), born_us = four_granted_the_first_claimed(store, clock)
    assert clock.now_us < born_us + MARKS_SETTLE_US
    wait(clock, g2.slot_us - g1.slot_us)
    again = ClaimTerms("w2", LEASE_US, redelivered=True)
    held = store.claim(c2, I_US, g2.slot, again)
    assert (held.outcome, held.delay_us) == (Outcome.WAIT, born_us + MARKS_SETTLE_US - clock.now_us)
    others = store.claim(c2, I_US, g2.slot, ClaimTerms("w3", LEASE_US))
    assert (others.outcome, others.delay_us) == (Outcome.WAIT, held.delay_us), "whoever claims"
    clock.now_us = born_us + MARKS_SETTLE_US
    assert store.claim(c2, I_US, g2.slot, again).outcome is Outcome.OK
    wait(clock, g3.slot_us - g2.slot_us)
    assert store.claim(c3, I_US, g3.slot, replace(again, holder="w4")).outcome is Outcome.OK
    wait(clock, g4.slot_us - g3.slot_us)
    assert store.claim(c4, I_US, g4.slot, ClaimTerms("w1", LEASE_US)).outcome is Outcome.OK


def test_the_birth_marker_reads_as_claims_find_it_and_no_read_writes_it(
    store: Store, clock: Clock
) -> None:
    """``born_us`` is None until a call making a state writes the marker (a read, and a
    status, write none), then the birth each claim carries."""
    assert store.born_us() is None
    store.status("api", I_US)
    assert store.born_us() is None
    copy = TaskCopy("api", "t1", 0)
    g = store.grant(copy, Pace(I_US))
    wait(clock, g.delay_us)
    claim = store.claim(copy, I_US, g.slot, ClaimTerms("w1", LEASE_US))
    assert claim.born_us is not None and store.born_us() == claim.born_us
