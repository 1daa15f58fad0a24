"""The outer field: tenant buckets nested by pattern or by name, bad entries refused by name."""

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


def _app(**declared: Any) -> Celery:
    app = Celery("outerconf", broker="memory://", set_as_current=False)
    queues = {"api": "25/s", "acct": 0.01, **declared}
    app.conf.update(interval_store_url="memory://", interval_queues=queues)
    return app


def test_tenants_nest_in_their_outer_with_its_interval_burst_and_limits() -> None:
    settings = settings_of(
        _app(
            api={"interval": "25/s", "burst": 3, "limits": ["100/min"]},
            **{"api:*": {"outer": "api"}, "api:big": {"outer": "acct"}},
        )
    )
    assert settings.outer_of("api:acme") == Outer("api", 40_000, 3, (Limit(600_000),))
    assert settings.outer_of("api:big") == Outer("acct", 10_000), "its own entry wins"
    assert settings.outer_of("api") is None, "the queue bucket is not its own tenant"
    assert settings.outer_of("mail:acme") is None
    assert settings_of(_app()).outer_of("api:acme") is None
    main = settings_of(_app(**{"api:*": {"outer": "api:main"}}))
    assert main.outer_of("api:acme") == Outer("api:main", 40_000)
    assert main.outer_of("api:main") is None, "the outer tenant is not nested in itself"


def test_outer_never_comes_from_the_queues_entry() -> None:
    """A queue's own ``outer`` nests the queue bucket, not its tenants (no queue fallback)."""
    settings = settings_of(_app(api={"interval": "25/s", "outer": "acct"}))
    assert settings.outer_of("api") == Outer("acct", 10_000)
    assert settings.outer_of("api:acme") is None


@pytest.mark.parametrize(
    ("declared", "match"),
    [
        ({"api:*": {"outer": 3}}, r"interval_queues\['api:\*'\]\['outer'\]=3: expected a bucket"),
        ({"*": "1/s"}, r"interval_queues key '\*': expected a queue, 'queue:\*' or 'queue:key'"),
        ({"a*:x": "1/s"}, r"interval_queues key 'a\*:x'"),
        ({"api:*": {"outer": "mail"}}, r"\['outer'\]='mail': no queue 'mail' is declared"),
        ({"api": {"interval": 1, "outer": "api"}}, r"not nested in itself"),
        ({"api:{x}": {"outer": "api"}}, r"a brace"),
        (
            {
                "api:*": {"outer": "acct"},
                "acct:*": {"outer": "api"},
                "acct": {"interval": 1, "outer": "api"},
            },
            r"one level of nesting only",
        ),
        (
            {"api:*": {"outer": "api:main"}, "api:main": {"outer": "acct"}},
            r"'api:main' is nested itself",
        ),
    ],
)
def test_bad_outer_declarations_are_refused_by_name(declared: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        settings_of(_app(**declared))


def test_a_file_store_refuses_nesting(tmp_path: Any) -> None:
    with pytest.raises(ConfigurationError, match="runs no nested buckets"):
        store_from_url(f"file://{tmp_path}", nesting=lambda bucket: None)


def test_the_memory_store_nests_by_the_settings() -> None:
    """Plain grants of nested buckets spend their outer's budget: two tenants' first slots
    are one outer interval apart, and the outer bucket's own task comes after them."""
    settings = settings_of(_app(**{"api:*": {"outer": "acct"}}))
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
    with pytest.raises(ConfigurationError, match=r"burst of bucket 'api' \(2; declare its burst"):
        check_within_burst("t", "api:acme", 3, 5, (), outer)


def test_a_tenants_starts_are_paced_by_its_outer_when_it_is_slower() -> None:
    """A pool process reaching a 1 ms tenant's start late counts as missed only past a tenth
    of its account's 40 ms (4 ms, at most 3 ms), not of its own 1 ms."""
    from celery_interval.worker.process.started import missed_after_ns

    settings = settings_of(_app(**{"api:*": {"interval": 0.001, "outer": "api"}}))
    assert settings.pace_us("api:acme", 1_000) == 40_000
    assert settings.pace_us("api:acme", 100_000) == 100_000
    assert settings.pace_us("acct", 10_000) == 10_000
    assert missed_after_ns(settings.pace_us("api:acme", 1_000)) == 3_000_000
