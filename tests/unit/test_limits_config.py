"""The limits setting: validated with the key and value named, tenant buckets fall back to
their queue's, a cost above a limit's burst refused; the audit's budget checks every limit."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_interval.config import settings_of
from celery_interval.config.values import describe_limits
from celery_interval.costs import check_within_burst
from celery_interval.errors import ConfigurationError
from celery_interval.inline import slot
from celery_interval.monitor.tally import BucketTally
from celery_interval.schedule import Limit
from celery_interval.starts import Budget, limits_of
from tests.helpers.apps import memory_app


def test_limits_are_rates_or_pairs_and_tenants_take_their_queues() -> None:
    limits = settings_of(
        memory_app(
            api={"interval": 0.05, "limits": ["10/s", ("1000/h", 50)]},
            **{"api:big": {"limits": [["2/s", 3]]}},
        )
    ).limits_of
    assert limits("api") == (Limit(100_000), Limit(3_600_000, 50))
    assert limits("api:acme") == limits("api")
    assert limits("api:big") == (Limit(500_000, 3),)
    assert limits("mail") == ()
    assert describe_limits(limits("api")) == "10/s, 1000/h burst 50"


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("10/s", "['limits']='10/s': expected a list of limits"),
        (["10/x"], "['limits'][0]='10/x'"),
        (["10/s", ("1/h", 0)], "['limits'][1] burst=0"),
        ([("1/h", 2, 3)], "['limits'][0]=('1/h', 2, 3)"),
    ],
)
def test_a_bad_limit_names_the_key_and_value(value: Any, named: str) -> None:
    named = "interval_queues['api']" + named
    pattern = named.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ConfigurationError, match=pattern):
        settings_of(memory_app(api={"interval": 0.05, "limits": value}))


def test_a_cost_above_a_limits_burst_is_refused() -> None:
    limits = (Limit(100_000, 5), Limit(600_000, 2))
    check_within_burst("t", "api", 2, 5, limits)
    with pytest.raises(ConfigurationError, match=r"limit 1 \(2; give limit 1 .* a burst of"):
        check_within_burst("t", "api", 3, 5, limits)
    app = memory_app(api={"interval": 0.05, "burst": 4, "limits": ["1/s"]})
    with pytest.raises(ConfigurationError, match="bucket's limits, so it could never start"):
        slot(app, "api", cost=2)


def test_limits_of_a_ledger_entry() -> None:
    assert limits_of({"op": "claim:OK"}) == ()
    assert limits_of({"limits": "100000:1,3600000:50"}) == ((100_000, 1), (3_600_000, 50))
    assert limits_of({"limits": "garbage"}) == ()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3_000), max_size=30),
    st.sampled_from([1, 2, 3]),
    st.sampled_from([700, 2_500, 4_000]),
)
def test_the_budget_holds_exactly_when_every_limits_windows_do(
    gaps: list[int], limit_burst: int, limit_us: int
) -> None:
    """The interval 1 ms (burst 3) and one extra limit: no start overdraws iff for every
    window both Σ cost <= 3 + span/1 ms and Σ cost <= limit_burst + span/limit_us."""
    starts, start_us = [], 0
    for gap in gaps:
        start_us += gap
        starts.append(start_us)
    budget = Budget()
    limits = ((limit_us, limit_burst),)
    clean = not any(budget.overdraws(s, 1_000, 3, 1, limits) for s in starts)

    def fits(burst: int, interval_us: int) -> bool:
        return all(
            (j - i + 1) * interval_us <= burst * interval_us + starts[j] - starts[i]
            for i in range(len(starts))
            for j in range(i, len(starts))
        )

    assert clean == (fits(3, 1_000) and fits(limit_burst, limit_us))


def test_the_exporters_tally_counts_a_start_past_an_extra_limit() -> None:
    tally = BucketTally()
    entry = {"op": "claim:OK", "interval": "1000", "limits": "3000:1"}
    for start_us in (0, 3_000, 5_000):
        tally.feed({**entry, "start": str(start_us), "task": f"t{start_us}"})
    assert (tally.starts, tally.violations) == (3, 1)
    assert tally.last_violation is not None and tally.last_violation.start_us == 5_000
