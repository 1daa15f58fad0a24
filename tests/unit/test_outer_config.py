"""The outer setting: tenant buckets nested by pattern or by name, bad entries refused by name."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_interval.config import settings_of
from celery_interval.costs import check_within_burst
from celery_interval.errors import ConfigurationError
from celery_interval.schedule import Limit, Pace
from celery_interval.schedule.outer import Outer
from celery_interval.stores import store_from_url
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.memory import MemoryStore


def _app(**conf: Any) -> Celery:
    app = Celery("outerconf", broker="memory://", set_as_current=False)
    app.conf.update(
        interval_store_url="memory://", interval_queues={"api": "25/s", "acct": 0.01}, **conf
    )
    return app


def test_tenants_nest_in_their_outer_with_its_interval_burst_and_limits() -> None:
    settings = settings_of(
        _app(
            interval_outer={"api:*": "api", "api:big": "acct"},
            interval_burst={"api": 3},
            interval_limits={"api": ["100/min"]},
        )
    )
    assert settings.outer_of("api:acme") == Outer("api", 40_000, 3, (Limit(600_000),))
    assert settings.outer_of("api:big") == Outer("acct", 10_000), "its own entry wins"
    assert settings.outer_of("api") is None, "the queue bucket is not its own tenant"
    assert settings.outer_of("mail:acme") is None
    assert settings_of(_app()).outer_of("api:acme") is None
    main = settings_of(_app(interval_outer={"api:*": "api:main"}))
    assert main.outer_of("api:acme") == Outer("api:main", 40_000)
    assert main.outer_of("api:main") is None, "the outer tenant is not nested in itself"


@pytest.mark.parametrize(
    ("outer", "match"),
    [
        (["api"], r"interval_outer=\['api'\]: expected a mapping"),
        ({"api:*": 3}, r"interval_outer\['api:\*'\]=3: expected a bucket name"),
        ({"*": "api"}, r"interval_outer key '\*': expected a bucket name or 'queue:\*'"),
        ({"a*:x": "api"}, r"interval_outer key 'a\*:x'"),
        ({"api:*": "mail"}, r"'mail' is not in interval_queues"),
        ({"api": "api"}, r"not nested in itself"),
        ({"api:{x}": "api"}, r"has a brace"),
        ({"api:*": "acct", "acct:*": "api", "acct": "api"}, r"one level of nesting only"),
        ({"api:*": "api:main", "api:main": "acct"}, r"'api:main' is nested itself"),
    ],
)
def test_bad_outer_settings_are_refused_by_name(outer: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        settings_of(_app(interval_outer=outer))


def test_a_file_store_refuses_nesting(tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match="runs no nested buckets"):
        store_from_url(f"file://{tmp_path}", nesting=lambda bucket: None)


def test_the_memory_store_nests_by_the_settings() -> None:
    """Plain grants of nested buckets spend their outer's budget: two tenants' first slots
    are one outer interval apart, and the outer bucket's own task comes after them."""
    settings = settings_of(_app(interval_outer={"api:*": "acct"}))
    now = [10**15]
    store = MemoryStore(clock_us=lambda: now[0], nesting=settings.outer_of)
    store._born = now[0] - 10**9  # an old store: new buckets start at once
    slots = [
        store.grant(TaskCopy(bucket, task, 0), Pace(settings.interval_us(bucket))).delay_us
        for bucket, task in (("api:a", "t1"), ("api:b", "t1"), ("acct", "t1"), ("api:a", "t2"))
    ]
    assert slots == [0, 10_000, 20_000, 40_000]


def test_a_cost_above_the_outer_burst_is_refused() -> None:
    """A tenant's task may not cost more than its outer bucket's burst (or a limit's): such a
    start could never fit the outer budget."""
    outer = Outer("api", 40_000, 2, (Limit(1_000_000, 3),))
    check_within_burst("t", "api:acme", 2, 5, (), outer)
    with pytest.raises(ConfigurationError, match=r"burst of bucket 'api' \(2; set interval_burst"):
        check_within_burst("t", "api:acme", 3, 5, (), outer)
