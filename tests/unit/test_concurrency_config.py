"""The concurrency cap's setting and task option: validated, errors naming the key."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_interval import IntervalTask
from celery_interval.config import settings_of
from celery_interval.errors import ConfigurationError
from celery_interval.worker.strategy import _cap_of


def _app(**conf: Any) -> Celery:
    app = Celery("capconf", broker="memory://", set_as_current=False)
    app.conf.update(interval_store_url="memory://", interval_queues={"api": 0.1}, **conf)
    return app


def test_a_tenant_bucket_takes_its_queues_cap() -> None:
    settings = settings_of(_app(interval_concurrency={"api": 2, "api:big": 5}))
    assert settings.concurrency_of("api") == 2
    assert settings.concurrency_of("api:acme") == 2
    assert settings.concurrency_of("api:big") == 5
    assert settings.concurrency_of("mail") is None


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ([("api", 2)], "interval_concurrency="),
        ({"api": 0}, "interval_concurrency['api']"),
        ({"api": True}, "interval_concurrency['api']"),
        ({"api": 1.5}, "interval_concurrency['api']"),
        ({"": 1}, "interval_concurrency key ''"),
    ],
)
def test_a_bad_cap_names_the_key(value: Any, named: str) -> None:
    with pytest.raises(ConfigurationError, match=named.replace("[", r"\[")):
        settings_of(_app(interval_concurrency=value))


def test_the_task_option_wins_and_is_checked_when_bound() -> None:
    app = _app(interval_concurrency={"api": 4})

    @app.task(base=IntervalTask, interval_concurrency=1, name="capconf.one")
    def one() -> None: ...

    @app.task(base=IntervalTask, name="capconf.plain")
    def plain() -> None: ...

    settings = settings_of(app)
    assert _cap_of(one, "api", settings) == 1
    assert _cap_of(plain, "api:t", settings) == 4
    with pytest.raises(ConfigurationError, match=r"capconf.bad.interval_concurrency=0"):

        @app.task(base=IntervalTask, interval_concurrency=0, name="capconf.bad", shared=False)
        def bad() -> None: ...

        bad.run  # noqa: B018 (binds the lazy task)
