"""The burst setting and the cost option: validated, the cost stamped at send and checked
against the burst there (a clear error), read back by the worker; the budget rule of the audit."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_interval import IntervalTask
from celery_interval.config import settings_of
from celery_interval.costs import message_cost
from celery_interval.errors import ConfigurationError
from celery_interval.headers import COST_HEADER
from celery_interval.monitor.tally import BucketTally
from celery_interval.placement import Arrival
from celery_interval.starts import Budget, is_violation, units_of


def _app(**conf: Any) -> Celery:
    app = Celery("costconf", broker="memory://", set_as_current=False)
    app.conf.update(interval_store_url="memory://", interval_queues={"api": 0.1}, **conf)
    return app


def test_a_tenant_bucket_takes_its_queues_burst() -> None:
    app = _app()
    app.conf.interval_queues = {"api": {"interval": 0.1, "burst": 5}, "api:big": {"burst": 9}}
    burst = settings_of(app).burst_of
    assert (burst("api"), burst("api:acme"), burst("api:big"), burst("mail")) == (5, 5, 9, 1)


@pytest.mark.parametrize("value", [0, True, 2.5, "3"])
def test_a_bad_burst_names_the_key_and_value(value: Any) -> None:
    app = _app()
    app.conf.interval_queues = {"api": {"interval": 0.1, "burst": value}}
    with pytest.raises(ConfigurationError, match=rf"interval_queues\['api'\]\['burst'\]={value!r}"):
        settings_of(app)


def _sent_headers(app: Celery) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    def record(headers: Any = None, **_: Any) -> None:
        sent.append(dict(headers or {}))

    before_task_publish.connect(record, weak=False)
    app._recorder = record  # type: ignore[attr-defined]  # disconnected by the caller
    return sent


def test_the_cost_is_stamped_at_send_and_a_cost_past_the_burst_is_an_error() -> None:
    app = _app(task_default_queue="api")
    app.conf.interval_queues = {"api": {"interval": 0.1, "burst": 5}}

    @app.task(base=IntervalTask, name="costconf.tokens", interval_cost=lambda a, k: k["n"] / 100)
    def tokens(n: int) -> None: ...

    sent = _sent_headers(app)
    try:
        tokens.apply_async(kwargs={"n": 250})
        tokens.apply_async(kwargs={"n": 250}, interval_cost=5)
        tokens.apply_async(kwargs={"n": 100}, headers={COST_HEADER: 4})  # a retry's copy
        with pytest.raises(ConfigurationError) as raised:
            tokens.apply_async(kwargs={"n": 600})
        message = str(raised.value)
        assert all(part in message for part in ("costconf.tokens", "'api'", "=6", "(5;"))
        with pytest.raises(ConfigurationError, match="interval_cost=0"):
            tokens.apply_async(kwargs={"n": 1}, interval_cost=0)
        with pytest.raises(ConfigurationError, match="'mail'"):
            tokens.apply_async(kwargs={"n": 200}, queue="mail")  # no burst there: 1
    finally:
        before_task_publish.disconnect(app._recorder)  # type: ignore[attr-defined]
    assert [h.get(COST_HEADER) for h in sent] == [3, 5, 4]


def test_the_worker_reads_the_header_else_the_option() -> None:
    app = _app()

    @app.task(base=IntervalTask, name="costconf.weighed", interval_cost=lambda a, k: len(a))
    def weighed(*args: Any) -> None: ...

    @app.task(base=IntervalTask, name="costconf.plain")
    def plain() -> None: ...

    assert message_cost(Arrival(weighed, {COST_HEADER: 2}, (1, 2, 3), {}, "api")) == 2
    assert message_cost(Arrival(weighed, {}, (1, 2, 3), {}, "api")) == 3
    assert message_cost(Arrival(plain, {}, (), {}, "api")) == 1
    with pytest.raises(ConfigurationError, match="message header interval_cost='x'"):
        message_cost(Arrival(plain, {COST_HEADER: "x"}, (), {}, "api"))


def test_a_bad_cost_option_is_an_error_when_bound() -> None:
    app = _app()
    app.finalize()
    with pytest.raises(ConfigurationError, match=r"costconf.bad.interval_cost='3'"):

        @app.task(base=IntervalTask, interval_cost="3", name="costconf.bad", shared=False)
        def bad() -> None: ...


def test_units_of_a_ledger_entry() -> None:
    assert units_of({"op": "claim:OK"}) == (1, 1)
    assert units_of({"op": "claim:OK", "burst": "5", "cost": "3"}) == (5, 3)


gaps_us = st.lists(st.integers(0, 3_000), max_size=30)


@settings(max_examples=200, deadline=None)
@given(gaps_us)
def test_the_budget_of_burst_and_cost_one_is_the_gap_rule(gaps: list[int]) -> None:
    budget, start_us, flagged, expected = Budget(), 0, [], []
    for i, gap in enumerate(gaps):
        start_us += gap
        flagged.append(budget.overdraws(start_us, 1_000))
        expected.append(i > 0 and is_violation(gap, 1_000))
    assert flagged == expected


@settings(max_examples=300, deadline=None)
@given(gaps_us, st.sampled_from([1, 2, 3, 5]), st.lists(st.integers(1, 5), max_size=30))
def test_the_budget_holds_exactly_when_every_window_does(
    gaps: list[int], burst: int, costs: list[int]
) -> None:
    """Starts in time order: no start overdraws iff Σ cost <= burst + span/interval for every
    window."""
    starts, start_us = [], 0
    for gap, cost in zip(gaps, costs, strict=False):
        start_us += gap
        starts.append((start_us, min(cost, burst)))
    budget = Budget()
    clean = not any(budget.overdraws(s, 1_000, burst, c) for s, c in starts)
    windows = all(
        sum(c for _, c in starts[i : j + 1]) * 1_000 <= burst * 1_000 + starts[j][0] - starts[i][0]
        for i in range(len(starts))
        for j in range(i, len(starts))
    )
    assert clean == windows


def test_the_exporters_tally_counts_a_burst_within_budget_and_an_overdraft() -> None:
    tally = BucketTally()
    entry = {"op": "claim:OK", "interval": "1000", "burst": "3"}
    for start_us, cost in ((0, "1"), (0, "2"), (3_000, "3"), (3_500, "1")):
        tally.feed({**entry, "start": str(start_us), "cost": cost, "task": f"t{start_us}"})
    assert (tally.starts, tally.violations) == (4, 1)
    assert tally.last_violation is not None and tally.last_violation.start_us == 3_500
