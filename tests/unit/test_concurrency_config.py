"""The concurrency cap's field and the task option's: validated, errors naming the key."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_interval import IntervalTask
from celery_interval.config import settings_of
from celery_interval.errors import ConfigurationError
from celery_interval.placement import own_of


def _app(api: Any = 0.1) -> Celery:
    app = Celery("capconf", broker="memory://", set_as_current=False)
    app.conf.update(interval_store_url="memory://", interval_queues={"api": api})
    return app


def test_a_tenant_bucket_takes_its_queues_cap() -> None:
    app = _app({"interval": 0.1, "concurrency": 2})
    app.conf.interval_queues["api:big"] = {"concurrency": 5}
    settings = settings_of(app)
    assert settings.concurrency_of("api") == 2
    assert settings.concurrency_of("api:acme") == 2
    assert settings.concurrency_of("api:big") == 5
    assert settings.concurrency_of("mail") is None


@pytest.mark.parametrize("value", [0, True, 1.5, "2"])
def test_a_bad_cap_names_the_key_and_value(value: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"interval_queues\['api'\]\['concurrency'\]="):
        settings_of(_app({"interval": 0.1, "concurrency": value}))


def test_the_task_option_wins_and_is_checked_when_bound() -> None:
    app = _app({"interval": 0.1, "concurrency": 4})

    @app.task(base=IntervalTask, interval={"concurrency": 1}, name="capconf.one")
    def one() -> None: ...

    @app.task(base=IntervalTask, name="capconf.plain")
    def plain() -> None: ...

    settings = settings_of(app)
    assert settings.concurrency_of("api", own_of(one)) == 1
    assert settings.concurrency_of("api:t", own_of(plain)) == 4
    with pytest.raises(ConfigurationError, match=r"capconf.bad.interval\['concurrency'\]=0"):

        @app.task(base=IntervalTask, interval={"concurrency": 0}, name="capconf.bad", shared=False)
        def bad() -> None: ...

        bad.run  # noqa: B018 (binds the lazy task)


def test_the_old_task_option_is_refused_saying_where_it_went() -> None:
    app = _app()
    with pytest.raises(ConfigurationError, match=r"interval=\{'concurrency': 2\}"):

        @app.task(base=IntervalTask, interval_concurrency=2, name="capconf.old", shared=False)
        def old() -> None: ...

        old.run  # noqa: B018 (binds the lazy task)
