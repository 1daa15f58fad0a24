"""Several limits of one bucket in the pure model: tables of each interaction rule."""

from __future__ import annotations

from typing import Any

import pytest

from celery_interval import schedule
from celery_interval.schedule import Limit, Limits
from celery_interval.schedule import limits as limits_model
from tests.helpers.schedule_checks import assert_window_property
from tests.helpers.schedule_model import (
    ML,
    OLD_BORN_US,
    PAUSE,
    STARTS,
    STATUS,
    UNPAUSE,
    Model,
    Step,
    at,
    claim,
    grant,
    set_interval,
    throttle,
)

LIMITS_TABLE = [
    (
        "a limit tighter than the interval spaces the grants and the starts",
        (Limit(3_000),), 1, OLD_BORN_US,
        [at(0), grant("a"), grant("b"), grant("c"), claim("a"), at(3_000), claim("b"),
         at(5_999), claim("c"), at(6_000), claim("c"), STARTS],
        [("OK", 1, 0, 0), ("OK", 2, 3_000, 3_000), ("OK", 3, 6_000, 6_000), ("OK", 0),
         ("OK", 0), ("WAIT", 1), ("OK", 0), ("starts", 0, 3_000, 6_000)],
    ),
    (
        "a limit's burst: 3 back to back at the interval, then one per the limit's interval",
        (Limit(2_000, 3),), 1, OLD_BORN_US,
        [at(0), grant("a"), grant("b"), grant("c"), grant("d"), grant("e"), grant("f")],
        [("OK", 1, 0, 0), ("OK", 2, 1_000, 1_000), ("OK", 3, 2_000, 2_000),
         ("OK", 4, 3_000, 3_000), ("OK", 5, 4_000, 4_000), ("OK", 6, 6_000, 6_000)],
    ),
    (
        "two limits: each slot is the latest any of them allows",
        (Limit(2_000, 3), Limit(5_000, 2)), 1, OLD_BORN_US,
        [at(0), grant("a"), grant("b"), grant("c"), grant("d"), claim("a"), claim("b"),
         at(1_000), claim("b"), at(5_000), claim("c"), at(10_000), claim("d"), STARTS],
        [("OK", 1, 0, 0), ("OK", 2, 1_000, 1_000), ("OK", 3, 5_000, 5_000),
         ("OK", 4, 10_000, 10_000), ("OK", 0), ("WAIT", 1_000), ("OK", 0), ("OK", 0), ("OK", 0),
         ("starts", 0, 1_000, 5_000, 10_000)],
    ),
    (
        "a throttle empties every limit's budget, the interval's burst and the limit's",
        (Limit(3_000),), 3, OLD_BORN_US,
        [at(0), grant("a"), claim("a"), at(5_000), throttle("a", 0), grant("d"), claim("a"),
         claim("d"), at(8_000), claim("d"), STARTS],
        [("OK", 1, 0, 0), ("OK", 0), ("throttled", 3_000), ("OK", 2, 6_000, 3_000), ("OK", 0),
         ("WAIT", 3_000), ("OK", 0), ("starts", 0, 5_000, 8_000)],
    ),
    (
        "a new epoch after state loss counts every limit's burst as used when it lost it",
        (Limit(5_000, 2),), 1, None,
        [at(0), grant("a"), grant("b"), at(ML + 1_000), claim("a"), at(ML + 5_000),
         claim("a"), claim("b"), at(ML + 10_000), claim("b")],
        [("OK", 1, ML + 5_000, ML + 5_000), ("OK", 2, ML + 10_000, ML + 10_000),
         ("WAIT", 4_000), ("OK", 0), ("WAIT", 5_000), ("OK", 0)],
    ),
    (
        "set_interval changes the interval only: the limit holds, status's next slot is its",
        (Limit(3_000),), 1, OLD_BORN_US,
        [at(0), grant("a"), claim("a"), set_interval(2_000), grant("b"), STATUS, claim("b"),
         at(3_000), claim("b")],
        [("OK", 1, 0, 0), ("OK", 0), ("OK", 2, 3_000, 3_000), ("status", 2, 6_000, 2_000, False),
         ("WAIT", 3_000), ("OK", 0)],
    ),
    (
        "a pause freezes every limit: its slots shift by the pause",
        (Limit(3_000),), 1, OLD_BORN_US,
        [at(0), grant("a"), claim("a"), PAUSE, at(10_000), UNPAUSE, grant("b"), claim("b"),
         at(13_000), claim("b")],
        [("OK", 1, 0, 0), ("OK", 0), ("OK", 2, 3_000, 3_000), ("WAIT", 3_000), ("OK", 0)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "limits", "burst", "born_us", "steps", "expected"),
    LIMITS_TABLE,
    ids=[t[0] for t in LIMITS_TABLE],
)
def test_limits(
    name: str,
    limits: Limits,
    burst: int,
    born_us: int | None,
    steps: list[Step],
    expected: list[Any],
) -> None:
    m = Model(limits=limits, burst=burst, born_us=born_us)
    assert m.run(steps) == expected
    for limit in limits:
        assert_window_property(m, limit.burst, limit.interval_us)


def test_no_extra_limits_leave_no_trace() -> None:
    """Without extra limits the record is the burst model's: no limit times kept."""
    m = Model(born_us=OLD_BORN_US)
    m.run([at(0), grant("a"), claim("a"), throttle("a", 500), grant("b"), claim("b")])
    assert m.state is not None and m.state.limit_tats == ()


def test_a_limit_added_later_counts_from_its_first_start() -> None:
    """A record written without a limit has no times for it: the limit starts with its whole
    budget (the earlier starts were counted against the limits in force then)."""
    m = Model(born_us=OLD_BORN_US)
    m.run([at(0), grant("a"), claim("a")])
    m.limits = (Limit(5_000),)
    assert m.run([at(1_000), grant("b"), claim("b"), grant("c"), at(6_000), claim("c")]) == [
        ("OK", 2, 1_000, 0), ("OK", 0), ("OK", 3, 6_000, 5_000), ("OK", 0)
    ]  # fmt: skip


def test_an_idle_bucket_is_kept_until_every_limit_has_refilled() -> None:
    """``expires_in_us`` waits for the slowest limit: a state dropped sooner would forget it."""
    slow = Model(limits=(Limit(50_000),), born_us=OLD_BORN_US)
    slow.run([at(0), grant("a"), claim("a")])
    plain = Model(born_us=OLD_BORN_US)
    plain.run([at(0), grant("a"), claim("a")])
    assert slow.expires_real_us is not None and plain.expires_real_us is not None
    assert slow.expires_real_us - plain.expires_real_us == 50_000 - 1_000


def test_a_fenced_state_counts_every_limits_burst_as_used() -> None:
    """After a failover's fence (``schedule.fenced``) a limit's next start waits its whole
    burst from the fenced start, as the interval's budget does."""
    m = Model(limits=(Limit(5_000, 3),), born_us=OLD_BORN_US)
    m.run([at(0), grant("a"), claim("a")])
    assert m.state is not None
    fenced = schedule.fenced(m.state, m.now_us, m.interval_us)
    assert fenced.lost_start_us is not None
    earliest_us = limits_model.earliest_start(fenced, m.limits, 1, 0)
    assert earliest_us == fenced.lost_start_us + (3 - 2) * 5_000


def test_status_says_when_the_next_ticket_starts_and_each_budget_left() -> None:
    """Burst 3 at 1 s and ("1/min", 2): after two tickets at once the interval's budget has 1
    unit left and the limit's none; the next slot is when "1/min" gives a unit back (30 s
    after the first), not when every budget is full again; read without the pace, the
    status counts until then. After 3 grants in a bucket without limits, the next slot is one
    interval away, not three."""
    from celery_interval.stores import TaskCopy
    from celery_interval.stores.memory import MemoryStore

    now = [1_000_000_000_000]
    store = MemoryStore(clock_us=lambda: now[0])
    store.grant(TaskCopy("born", "x", 0), schedule.Pace(1_000_000))  # the store's birth...
    now[0] += 3_600_000_000  # ...long past: a new bucket's budgets are full
    pace = schedule.Pace(1_000_000, burst=3, limits=(Limit(30_000_000, 2),))
    for task in ("a", "b"):
        assert store.grant(TaskCopy("api", task, 0), pace).delay_us == 0
    status = store.status("api", 1_000_000, pace)
    assert (status.units_left, status.next_slot_in_us) == ((1, 0), 30_000_000)
    assert store.status("api", 1_000_000).next_slot_in_us == 60_000_000
    now[0] += 30_000_000
    assert store.status("api", 1_000_000, pace).units_left == (3, 1)

    burst = schedule.Pace(1_000_000, burst=3)
    for task in ("a", "b", "c"):
        store.grant(TaskCopy("mail", task, 0), burst)
    status = store.status("mail", 1_000_000, burst)
    assert (status.units_left, status.next_slot_in_us) == ((0,), 1_000_000)
    assert store.status("mail", 1_000_000).next_slot_in_us == 3_000_000
    now[0] += 1_500_000
    assert store.status("mail", 1_000_000, burst).units_left == (1,)
