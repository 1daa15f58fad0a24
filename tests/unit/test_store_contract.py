"""One contract, three stores: Redis (real server, Redis TIME), file (fcntl), memory."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_interval.schedule import (
    MAX_LEAD_US,
    PLACE_SETTLE_US,
    ClaimTerms,
    Limit,
    Outcome,
    Pace,
)
from celery_interval.stores.base import Store, TaskCopy
from celery_interval.stores.file import FileStore
from celery_interval.stores.memory import MemoryStore
from celery_interval.stores.redis import RedisStore

I_US = 40_000  # long enough that a slow machine never crosses a slot by accident
LEASE_US = 60_000_000


@pytest.fixture(params=["redis", "file", "memory"])
def store(request: Any, tmp_path: Path) -> Iterator[Store]:
    if request.param == "redis":
        yield request.getfixturevalue("redis_store")
    elif request.param == "file":
        (tmp_path / "state").mkdir()
        yield FileStore(tmp_path / "state")
    else:
        yield MemoryStore()


def wait_s(delay_us: int) -> None:
    time.sleep(max(0, delay_us) / 1e6 + 0.002)


def test_tickets_and_slots_follow_one_another(store: Store) -> None:
    grants = [store.grant(TaskCopy("b", f"t{i}", 0), Pace(I_US)) for i in range(5)]
    assert [g.ticket for g in grants] == [1, 2, 3, 4, 5]
    assert all(g.outcome is Outcome.OK and g.epoch == grants[0].epoch for g in grants)
    slots = [g.slot_us for g in grants]
    assert [b - a for a, b in itertools.pairwise(slots)] == [I_US] * 4
    assert grants[0].delay_us >= I_US + MAX_LEAD_US - 5_000  # a new epoch waits one interval


def test_claims_wait_for_their_slot_then_start(store: Store) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    early = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US))
    assert early.outcome is Outcome.WAIT and 0 < early.delay_us <= g.delay_us
    wait_s(early.delay_us - 18_000)  # claim up to MAX_LEAD_US early: the start is ahead
    ok = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US, MAX_LEAD_US))
    assert ok.outcome is Outcome.OK and 0 < ok.delay_us <= MAX_LEAD_US
    again = store.claim(
        TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US, MAX_LEAD_US)
    )
    assert again.outcome is Outcome.OK, "a claim is idempotent for its holder"
    assert again.now_us + again.delay_us == ok.now_us + ok.delay_us, "the same start"
    other = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h2", LEASE_US))
    assert other.outcome is Outcome.HELD and 0 < other.delay_us <= LEASE_US
    wait_s(ok.delay_us)  # the admitted start passes unheard (as if the OK reply were lost)
    late = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US))
    assert (late.outcome, late.delay_us) == (Outcome.OK, 0), "no start since: it moves to now"
    assert late.now_us > ok.now_us + ok.delay_us


def test_done_makes_copies_duplicates_but_not_retries(store: Store) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    wait_s(g.delay_us)
    assert (
        store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US)).outcome
        is Outcome.OK
    )
    store.done([TaskCopy("b", "t1", 0)], 60_000_000)
    assert store.grant(TaskCopy("b", "t1", 0), Pace(I_US)).outcome is Outcome.DUPLICATE
    claim = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h2", LEASE_US))
    assert claim.outcome is Outcome.DUPLICATE
    assert store.grant(TaskCopy("b", "t1", 1), Pace(I_US)).outcome is Outcome.OK


def test_a_posted_done_mark_makes_copies_duplicates(store: Store) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    wait_s(g.delay_us)
    assert (
        store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US)).outcome
        is Outcome.OK
    )
    store.prepare_post()
    store.post_done(TaskCopy("b", "t1", 0), 60_000_000)
    time.sleep(0.05)  # posted on a connection of its own: no reply awaited
    assert store.grant(TaskCopy("b", "t1", 0), Pace(I_US)).outcome is Outcome.DUPLICATE
    assert store.grant(TaskCopy("b", "t1", 1), Pace(I_US)).outcome is Outcome.OK


def test_lease_expiry_lets_a_copy_run_and_renew_extends(store: Store) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    wait_s(g.delay_us)
    short_us = 600_000  # long enough that a loaded machine (fsync of the file store) keeps it
    assert (
        store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", short_us)).outcome
        is Outcome.OK
    )
    assert store.renew("b", "t1", 0, "h1", short_us) is True
    assert store.renew("b", "t1", 0, "h2", short_us) is False
    g2 = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    held = store.claim(TaskCopy("b", "t1", 0), I_US, g2.slot, ClaimTerms("h2", LEASE_US))
    assert held.outcome in (Outcome.HELD, Outcome.WAIT)
    wait_s(max(short_us, g2.delay_us))
    ok = store.claim(TaskCopy("b", "t1", 0), I_US, g2.slot, ClaimTerms("h2", LEASE_US))
    assert ok.outcome is Outcome.OK


def test_pause_holds_every_start_and_unpause_shifts_slots(store: Store) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    paused = store.pause("b", I_US)
    assert paused.paused and paused.exists
    wait_s(g.delay_us)
    claim = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US))
    assert claim.outcome is Outcome.PAUSED
    g2 = store.grant(TaskCopy("b", "t2", 0), Pace(I_US))
    assert g2.paused and g2.slot_us == g.slot_us + I_US
    resumed = store.unpause("b", I_US)
    assert not resumed.paused
    first = store.claim(TaskCopy("b", "t1", 0), I_US, g.slot, ClaimTerms("h1", LEASE_US))
    assert first.outcome is Outcome.WAIT, "the pause shifted the slot by its own length"
    wait_s(first.delay_us)
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


def _settled(store: Store) -> None:
    """Let the store's birth marker age past PLACE_SETTLE_US: capped claims no longer wait for
    running bodies to take back places a lost store forgot."""
    store.grant(TaskCopy("warm", "w", 0), Pace(I_US))
    wait_s(PLACE_SETTLE_US)


def _claim_due(store: Store, copy: TaskCopy, terms: ClaimTerms) -> Any:
    """Grant ``copy`` and claim it at its slot, waiting as the store says (not when FULL)."""
    g = store.grant(copy, Pace(I_US))
    while True:
        claimed = store.claim(copy, I_US, g.slot, terms)
        if claimed.outcome is not Outcome.WAIT:
            return claimed
        wait_s(claimed.delay_us)


def test_a_capped_bucket_runs_at_most_cap_bodies_and_a_release_frees_a_place(
    store: Store,
) -> None:
    _settled(store)
    terms = ClaimTerms("h1", LEASE_US, cap=2)
    a, b, c = (TaskCopy("b", f"t{i}", 0) for i in range(3))
    assert _claim_due(store, a, terms).outcome is Outcome.OK
    assert _claim_due(store, b, terms).outcome is Outcome.OK
    full = _claim_due(store, c, terms)
    assert full.outcome is Outcome.FULL and 0 < full.delay_us <= 50_000
    assert store.status("b", I_US).running == 2
    assert store.renew_place(a, LEASE_US) and not store.renew_place(c, LEASE_US)
    store.reset("b")  # a reset frees no place
    assert store.status("b", I_US).running == 2
    assert store.release(a) and not store.release(a)
    assert store.status("b", I_US).running == 1
    assert _claim_due(store, c, terms).outcome is Outcome.OK
    d = TaskCopy("b", "t3", 0)
    assert _claim_due(store, d, terms).outcome is Outcome.FULL


def test_a_place_not_renewed_comes_back_when_it_expires(store: Store) -> None:
    _settled(store)
    short = ClaimTerms("h1", LEASE_US, cap=1, place_us=60_000)
    a, b = TaskCopy("b", "t1", 0), TaskCopy("b", "t2", 0)
    assert _claim_due(store, a, short).outcome is Outcome.OK
    full = _claim_due(store, b, short)
    assert full.outcome is Outcome.FULL
    time.sleep(0.07)
    assert store.status("b", I_US).running == 0, "an expired place is not counted"
    assert _claim_due(store, b, short).outcome is Outcome.OK
    assert not store.renew_place(a, LEASE_US)


def test_a_new_store_lets_running_bodies_take_back_their_places_first(store: Store) -> None:
    """A store that lost its records forgot the places of bodies still running: for
    PLACE_SETTLE_US after its birth a capped claim holding no place is FULL, while a running
    body's renewal takes its place back (under the cap, never past it)."""
    terms = ClaimTerms("h1", LEASE_US, cap=1)
    a, running, other = TaskCopy("b", "a", 0), TaskCopy("b", "run", 0), TaskCopy("b", "x", 0)
    g = store.grant(a, Pace(I_US))  # the store is born here
    wait_s(g.delay_us)
    first = store.claim(a, I_US, g.slot, terms)
    assert first.outcome is Outcome.FULL
    assert PLACE_SETTLE_US - 1_000_000 < first.delay_us <= PLACE_SETTLE_US, first
    assert store.renew_place(running, LEASE_US, cap=1), "a running body takes its place back"
    assert not store.renew_place(other, LEASE_US, cap=1), "never past the cap"
    assert store.status("b", I_US).running == 1
    wait_s(first.delay_us)
    assert store.claim(a, I_US, g.slot, terms).outcome is Outcome.FULL, "the cap is full"
    assert store.release(running)
    assert store.claim(a, I_US, g.slot, terms).outcome is Outcome.OK


def test_reset_starts_a_new_epoch_and_old_tickets_reticket(store: Store) -> None:
    g = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    store.reset("b")
    wait_s(g.delay_us)
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
    the server closed is replaced by the next prepare."""
    import signal

    import redis

    from celery_interval.demo.embedded import RedisProc
    from celery_interval.stores.redis import RedisStore

    def post(task: str) -> None:
        store.prepare_post()
        store.post_done(TaskCopy("b", task, 0), 60_000_000)

    def duplicate(task: str) -> bool:
        time.sleep(0.05)  # the post's reply is not awaited
        return store.grant(TaskCopy("b", task, 0), Pace(I_US)).outcome is Outcome.DUPLICATE

    server = RedisProc()
    admin = redis.Redis.from_url(server.url)
    try:
        store = RedisStore.from_url(server.url, socket_timeout_s=5.0)
        store.prepare_post()
        proc: Any = server.proc
        proc.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            for i in range(3):
                store.post_done(TaskCopy("b", f"t{i}", 0), 60_000_000)
            posting_s = time.monotonic() - started
        finally:
            proc.send_signal(signal.SIGCONT)
        assert posting_s < 1.0, f"posting to a hung store took {posting_s:.2f}s"
        assert duplicate("t0") and duplicate("t2")
        admin.script_flush()  # as after a restart: no scripts
        post("t3")  # meets NOSCRIPT; the next prepare reads that and sends it again
        time.sleep(0.05)
        post("t4")
        assert duplicate("t3") and duplicate("t4")
        admin.client_kill_filter(skipme=True)  # the server closes every other connection
        post("t5")
        assert duplicate("t5")
    finally:
        admin.close()
        server.stop()


def test_a_bucket_made_once_the_store_is_an_interval_old_starts_at_once(store: Store) -> None:
    first = store.grant(TaskCopy("b", "t1", 0), Pace(I_US))
    assert first.delay_us >= I_US + MAX_LEAD_US - 5_000, "a new store may have lost a start"
    wait_s(I_US + MAX_LEAD_US)
    taken, claimed = store.take(
        TaskCopy("c", "t1", 0), Pace(I_US), ClaimTerms("h1", LEASE_US, MAX_LEAD_US)
    )
    assert taken.delay_us == 0 and claimed is not None and claimed.outcome is Outcome.OK
    reset_ns = time.monotonic_ns()
    store.reset("c")
    again = store.grant(TaskCopy("c", "t2", 0), Pace(I_US))
    since_reset_us = (time.monotonic_ns() - reset_ns) // 1000  # a loaded host is slow here
    assert again.delay_us >= I_US + MAX_LEAD_US - since_reset_us, "a reset keeps the first wait"


def test_a_burst_starts_back_to_back_after_an_idle_spell_then_one_per_interval(
    store: Store,
) -> None:
    """burst 3: a new store counts its burst as used at its birth; once the budget has come
    back, three starts come at once, and the fourth an interval after them (here a cost of 2
    and two of 1 spend 4 units: the fourth waits for one more)."""
    first = store.grant(TaskCopy("b", "t0", 0), Pace(I_US, burst=3))
    assert first.delay_us >= I_US + MAX_LEAD_US - 5_000, "a new store: no burst yet"
    wait_s(first.delay_us + 4 * I_US)  # idle: the whole budget is back
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


@pytest.fixture(params=["redis", "file", "memory"])
def clocked(request: Any, tmp_path: Path) -> Iterator[tuple[Store, list[int]]]:
    """A store on a clock the test moves (``now[0]``, µs): replies and reads compare exactly."""
    now = [1_750_000_000_000_000]

    def clock() -> int:
        return now[0]

    if request.param == "redis":
        yield RedisStore(request.getfixturevalue("redis_client"), now_us=clock), now
    elif request.param == "file":
        (tmp_path / "state").mkdir()
        yield FileStore(tmp_path / "state", clock_us=clock), now
    else:
        yield MemoryStore(clock_us=clock), now


def test_several_limits_hold_at_once(clocked: tuple[Store, list[int]]) -> None:
    """The interval I_US and a limit of 2 per 5 intervals (burst 2): after an idle spell two
    start back to back at the interval, the third waits until the limit's budget is back (on a
    clock the test moves, so a slow machine cannot move a claim off its slot)."""
    store, now = clocked
    limits = (Limit(5 * I_US // 2, 2),)
    first = store.grant(TaskCopy("l", "t0", 0), Pace(I_US, limits=limits))
    now[0] += first.delay_us + 6 * I_US  # idle: every budget is back
    grants = [store.grant(TaskCopy("l", f"t{i}", 0), Pace(I_US, limits=limits)) for i in (1, 2, 3)]
    offsets_us = [g.slot_us - grants[0].slot_us for g in grants]
    assert offsets_us == [0, I_US, 5 * I_US // 2]
    terms = ClaimTerms("h1", LEASE_US, 0, 0, limits=limits)
    now[0] += grants[0].delay_us
    claimed = store.claim(TaskCopy("l", "t1", 0), I_US, grants[0].slot, terms)
    assert claimed.outcome is Outcome.OK
    now[0] = grants[1].slot_us
    assert store.claim(TaskCopy("l", "t2", 0), I_US, grants[1].slot, terms).outcome is Outcome.OK
    late = store.claim(TaskCopy("l", "t3", 0), I_US, grants[2].slot, terms)
    assert late.outcome is Outcome.WAIT
    assert late.delay_us == grants[2].slot_us - now[0] == 3 * I_US // 2


def test_control_replies_read_the_budgets_as_status_does(
    clocked: tuple[Store, list[int]],
) -> None:
    """A bucket with a burst of 3 and a limit of 2 per 2 intervals: with the bucket's pace,
    the reply of pause, set_interval, unset_interval and unpause is the status read right
    after it: the slot a ticket would get now (here at once, one unit of each budget spent)
    and each budget's units left, not the time every budget is full again."""
    store, now = clocked
    pace = Pace(I_US, burst=3, limits=(Limit(2 * I_US, 2),))
    fresh = store.unset_interval("fresh", I_US, pace).status
    assert fresh == store.status("fresh", I_US, pace)
    store.grant(TaskCopy("b", "t0", 0), pace)
    now[0] += 10 * I_US  # idle: every budget is back
    assert store.grant(TaskCopy("b", "t1", 0), pace).delay_us == 0
    now[0] += I_US // 4
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
        now[0] += I_US // 3


def test_control_replies_count_the_running_bodies(clocked: tuple[Store, list[int]]) -> None:
    """Two bodies of a bucket capped at 2 run: the reply of each control operation counts
    them as ``status`` does, and one fewer after one's place is released."""
    store, now = clocked
    store.grant(TaskCopy("warm", "w", 0), Pace(I_US))  # the store's birth marker
    now[0] += PLACE_SETTLE_US + I_US
    terms = ClaimTerms("h1", LEASE_US, cap=2)
    bodies = [TaskCopy("b", f"t{i}", 0) for i in range(2)]
    for copy in bodies:
        granted = store.grant(copy, Pace(I_US))
        now[0] += granted.delay_us
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
