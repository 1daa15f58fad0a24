"""A task's interval_bucket or interval_cost callable that raises: a bug fails the message
visibly, an error that may pass (a lookup's ConnectionError) is tried again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

from celery_interval import IntervalTask
from celery_interval.costs import message_cost
from celery_interval.errors import ConfigurationError, IntervalError
from celery_interval.placement import Arrival, placement_of


def failing(exc: Exception) -> Callable[[Any, Any], Any]:
    def option(args: Any, kwargs: Any) -> Any:
        raise exc

    return option


def arrival_of(**options: Any) -> Arrival:
    app = Celery("callables", set_as_current=False)
    app.conf.interval_store_url = "memory://"
    app.conf.interval_queues = {"api": 0.05}

    @app.task(base=IntervalTask, name="callables.t", shared=False, **options)
    def t(tenant: str = "") -> None:
        return None

    return Arrival(t._get_current_object(), {"id": "m1"}, (), {}, "api")


def place(arrival: Arrival) -> None:
    placement_of(arrival, lambda bucket: 50_000)
    message_cost(arrival)


@pytest.mark.parametrize("option", ["interval_bucket", "interval_cost"])
def test_a_callable_that_may_recover_is_transient_and_a_bug_is_a_configuration_error(
    option: str,
) -> None:
    from celery_interval.errors import TransientError

    for exc in (ConnectionError("lookup down"), TimeoutError("slow"), RuntimeError("503")):
        with pytest.raises(IntervalError) as info:
            place(arrival_of(**{option: failing(exc)}))
        assert isinstance(info.value, TransientError), f"{exc!r}: {info.value!r}"
        assert not isinstance(info.value, ConfigurationError), "it may pass: tried again"
        assert repr(exc) in str(info.value)
    for exc in (KeyError("tenant"), TypeError("args"), ValueError("bad"), AttributeError("x")):
        with pytest.raises(ConfigurationError, match=f"callables.t.{option} raised"):
            place(arrival_of(**{option: failing(exc)}))
