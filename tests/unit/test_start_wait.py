"""A pool process's wait for a start: the done mark goes out as the spin begins, the body at
the deadline (a write that wakes the store must not delay the body)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery

from celery_interval import IntervalTask
from celery_interval.app_store import store_of
from celery_interval.headers import CLAIM_HEADER, MARK_HEADER, SPIN_HEADER, START_HEADER
from celery_interval.schedule import ClaimTerms, Pace
from celery_interval.stores.base import ClaimArgs, TaskCopy
from celery_interval.worker.process import started
from celery_interval.worker.process.started import wait_until

#: Generous, so a descheduled test process does not pass for the order under test.
SPIN_NS = 40_000_000
AHEAD_NS = 400_000_000


def test_on_spin_runs_inside_the_spin_and_the_wait_ends_at_the_deadline() -> None:
    deadline_ns = time.monotonic_ns() + AHEAD_NS
    calls: list[int] = []
    wait_until(deadline_ns, SPIN_NS, lambda: calls.append(time.monotonic_ns()))
    ended_ns = time.monotonic_ns()
    assert len(calls) == 1
    assert deadline_ns - SPIN_NS <= calls[0] < deadline_ns <= ended_ns


def test_an_ordinary_task_posts_its_mark_before_its_start(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("startwait", set_as_current=False)
    events: list[tuple[str, int, Any]] = []
    monkeypatch.setattr(
        started,
        "poster",
        lambda app, mark: lambda: events.append(("mark", time.monotonic_ns(), mark)),
    )

    @app.task(base=IntervalTask, bind=True, name="startwait.body")
    def body(self: Any) -> None:
        events.append(("body", time.monotonic_ns(), None))

    start_ns = time.monotonic_ns() + AHEAD_NS
    claim = ClaimArgs("b", "t1~1", 2, 50_000, 1, 1, "w/1", 7, 8_000)
    headers = {START_HEADER: start_ns, SPIN_HEADER: SPIN_NS, MARK_HEADER: True, CLAIM_HEADER: claim}
    body.push_request(id="t1", retries=2, **headers)
    try:
        body()
    finally:
        body.pop_request()
    (mark, mark_ns, mark_args), (kind, body_ns, _) = events
    assert (mark, kind) == ("mark", "body")
    assert (mark_args.bucket, mark_args.task_id, mark_args.retries) == ("b", "t1~1", 2)
    assert start_ns - SPIN_NS <= mark_ns < start_ns <= body_ns


def test_a_task_without_a_mark_to_post_only_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("startwait", set_as_current=False)
    monkeypatch.setattr(started, "poster", lambda *a: pytest.fail("posted a mark"))
    starts: list[int] = []

    @app.task(base=IntervalTask, bind=True, name="startwait.late", acks_late=True)
    def late(self: Any) -> None:
        starts.append(time.monotonic_ns())

    start_ns = time.monotonic_ns() + AHEAD_NS
    late.push_request(id="t2", **{START_HEADER: start_ns, SPIN_HEADER: SPIN_NS})
    try:
        late()
    finally:
        late.pop_request()
    assert starts and starts[0] >= start_ns


def _late_to_its_process(later_start: bool) -> tuple[list[int], int, int, Any]:
    """A task whose pool process reaches it 30 ms after its start (a process replaced, a full
    pool); ``later_start``: another task's start was admitted meanwhile. Returns the body's
    start (monotonic ns), its admitted start (monotonic ns and store µs) and the store."""
    app = Celery("startwait", set_as_current=False)
    app.conf.update(interval_store_url="memory://", interval_queues={"b": 0.05})
    starts: list[int] = []

    @app.task(base=IntervalTask, bind=True, name="startwait.missed", shared=False)
    def missed(self: Any) -> None:
        starts.append(time.monotonic_ns())

    store = store_of(app)
    grant, claim = store.take(TaskCopy("b", "t3", 0), Pace(50_000), ClaimTerms("w/3", 30_000_000))
    time.sleep(grant.delay_us / 1e6)  # a new bucket's first slot
    grant, claim = store.take(
        TaskCopy("b", "t3", 0), Pace(50_000), ClaimTerms("w/3", 30_000_000, lead_us=20_000)
    )
    assert claim is not None and claim.outcome.value == "OK"
    claimed_ns = time.monotonic_ns() + claim.delay_us * 1000
    if later_start:
        other = store.grant(TaskCopy("b", "t4", 0), Pace(50_000))
        delay_us = other.delay_us
        for _ in range(5):  # sleeps on this host's clock end a little early for the store's
            time.sleep(delay_us / 1e6)
            taken = store.claim(
                TaskCopy("b", "t4", 0), 50_000, other.slot, ClaimTerms("w/4", 10**7)
            )
            if taken.outcome.value != "WAIT":
                break
            delay_us = taken.delay_us
        assert taken.outcome.value == "OK"
    time.sleep(0.03)  # the pool process reaches the task 30 ms (or more) after its start
    headers = {
        START_HEADER: claimed_ns,
        SPIN_HEADER: 0,
        CLAIM_HEADER: ClaimArgs(
            "b", "t3", 0, 50_000, grant.epoch, grant.slot_us, "w/3", grant.ticket, 8000
        ),
    }
    missed.push_request(id="t3", **headers)
    try:
        missed()
    finally:
        missed.pop_request()
    return starts, claimed_ns, claim.now_us + claim.delay_us, store


def test_a_task_that_reached_its_process_after_its_start_moves_it_when_none_came_since() -> None:
    """The pool process must not run the body late on the missed start: it claims again, and
    with no start admitted since, its start moves to now (no slot lost, the next one an
    interval after the moved start)."""
    starts, _, admitted_us, store = _late_to_its_process(later_start=False)
    moved_us = store.status("b", 50_000).last_start_us
    assert moved_us - admitted_us >= 30_000, "the body ran late instead of claiming again"
    assert starts[0] // 1000 - admitted_us >= 30_000  # the store's clock is this monotonic one


def test_a_task_that_reached_its_process_after_a_later_start_waits_an_interval_after_it() -> None:
    """Another task started after the missed start: the claim again waits an interval after
    that one."""
    starts, _, admitted_us, store = _late_to_its_process(later_start=True)
    body_us = starts[0] // 1000  # the memory store's clock is this process's monotonic one
    assert body_us - admitted_us >= 100_000, "the body ran before an interval after t4's"
    assert store.status("b", 50_000).last_start_us - admitted_us >= 100_000
