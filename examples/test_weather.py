"""Tests of weather.py's interval task, with the celery_interval pytest plugin (conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
import weather
from celery.exceptions import TimeoutError as ResultTimeout

from celery_interval.testing import IntervalControl, Start, assert_spaced, configure_app

CITIES = ["Oslo", "Lima", "Pune", "Kyiv", "Accra", "Quito"]
FAST = 0.05  # the queue's 1 s interval, shortened for the tests: real 50 ms, on the store's clock


@pytest.fixture
def interval_app(interval_redis_url: str) -> Any:
    """The app under test, on the plugin's private Redis (broker, store and results)."""
    return configure_app(weather.app, interval_redis_url, intervals={"weather": FAST})


def test_calls_start_an_interval_apart_in_order(
    interval_worker: Any, interval_control: IntervalControl
) -> None:
    results = [weather.fetch_forecast.delay(city) for city in CITIES]
    assert [r.get(timeout=30) for r in results] == [f"forecast for {c}" for c in CITIES]
    starts = interval_control.assert_spaced("weather", FAST)  # fails if two came too close
    # one worker: the tasks took their tickets in the order they were sent (a task whose
    # process came late starts again under its ticket: a readmit, still spaced)
    by_ticket = sorted(starts, key=lambda s: (s.epoch, s.ticket))
    assert list(dict.fromkeys(s.task_id for s in by_ticket)) == [r.id for r in results]


def test_a_paused_queue_starts_nothing_until_unpaused(
    interval_worker: Any, interval_control: IntervalControl
) -> None:
    interval_control.pause("weather")
    result = weather.fetch_forecast.delay("Oslo")
    with pytest.raises(ResultTimeout):
        result.get(timeout=1.0)
    assert interval_control.starts("weather") == []
    interval_control.unpause("weather")
    assert result.get(timeout=30) == "forecast for Oslo"


def test_a_new_interval_holds_for_the_next_starts(
    interval_worker: Any, interval_control: IntervalControl
) -> None:
    interval_control.set_interval("weather", 0.2)
    results = [weather.fetch_forecast.delay(city) for city in CITIES[:3]]
    assert [r.get(timeout=30) for r in results] == [f"forecast for {c}" for c in CITIES[:3]]
    interval_control.assert_spaced("weather", 0.2)


def test_two_worker_processes_share_one_interval(
    interval_worker_processes: Any, interval_control: IntervalControl
) -> None:
    interval_worker_processes.start("weather:app", n=2, concurrency=2)
    results = [weather.fetch_forecast.delay(city) for city in CITIES * 2]
    assert [r.get(timeout=60) for r in results] == [f"forecast for {c}" for c in CITIES * 2]
    starts = interval_control.assert_spaced("weather", FAST)  # in ticket order too
    assert {s.task_id for s in starts} == {r.id for r in results}


def test_the_check_fails_on_starts_closer_than_the_interval() -> None:
    too_close = [Start(at_us=0, ticket=1), Start(at_us=30_000, ticket=2)]  # 30 ms at 50 ms
    with pytest.raises(AssertionError, match=r"30\.000 ms apart"):
        assert_spaced(too_close, FAST)
