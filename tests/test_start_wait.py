"""A pool process's wait for a start: the done mark goes out as the spin begins, the body at
the deadline (a write that wakes the store must not delay the body)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery

from celery_interval import IntervalTask
from celery_interval.task import MARK_HEADER, SPIN_HEADER, START_HEADER, wait_until
from celery_interval.worker import started

#: Generous, so a descheduled test process does not pass for the order under test.
SPIN_NS = 40_000_000
AHEAD_NS = 80_000_000


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
        lambda *a: lambda: events.append(("mark", time.monotonic_ns(), a[1:])),
    )

    @app.task(base=IntervalTask, bind=True, name="startwait.body")
    def body(self: Any) -> None:
        events.append(("body", time.monotonic_ns(), None))

    start_ns = time.monotonic_ns() + AHEAD_NS
    body.push_request(
        id="t1", retries=2, **{START_HEADER: start_ns, SPIN_HEADER: SPIN_NS, MARK_HEADER: "b"}
    )
    try:
        body()
    finally:
        body.pop_request()
    (mark, mark_ns, mark_args), (kind, body_ns, _) = events
    assert (mark, kind) == ("mark", "body")
    assert mark_args == ("b", "t1", 2)
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
