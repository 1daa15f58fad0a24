"""Every example runs: an embedded worker on the private Redis executes its tasks, spaced."""

from __future__ import annotations

import importlib
import itertools
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_interval.config import settings_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch, redis_server: Any, redis_client: Any) -> Any:
    monkeypatch.setenv("BROKER_URL", redis_server.broker_url_for(3))
    monkeypatch.setenv("INTERVAL_STORE_URL", redis_server.url_for(0))
    monkeypatch.syspath_prepend(str(EXAMPLES))

    def load(name: str) -> Any:
        sys.modules.pop(name, None)
        module = importlib.import_module(name)
        module.app.loader.import_module("celery.contrib.testing.tasks")
        return module

    return load


def _wait(results: list[Any], timeout_s: float = 30) -> list[Any]:
    return [r.get(timeout=timeout_s) for r in results]


def test_api_client_calls_once_per_second(example: Any) -> None:
    mod = example("api_client")
    mod.app.conf.result_backend = mod.app.conf.broker_url
    with start_worker(mod.app, pool="solo", perform_ping_check=False, queues=["api"]):
        results = [mod.call_api.delay(i) for i in range(3)]
        began = time.monotonic()
        assert _wait(results) == [f"fetched {i}" for i in range(3)]
        assert time.monotonic() - began >= 2.0, "3 calls at 1/s take at least 2 s"


def test_tenants_get_their_own_buckets(example: Any, redis_client: Any) -> None:
    mod = example("tenants")
    mod.app.conf.result_backend = mod.app.conf.broker_url
    mod.app.conf.interval_queues = {"reports": "60/s"}  # the example's 30/m, sped up
    from celery_interval import config

    config.forget(mod.app)
    with start_worker(mod.app, pool="solo", perform_ping_check=False, queues=["reports"]):
        results = [
            mod.build_report.delay(i, tenant=t)
            for i, t in itertools.product(range(3), ("acme", "globex"))
        ]
        assert sorted(_wait(results)) == sorted(
            f"{t}/{i}" for i, t in itertools.product(range(3), ("acme", "globex"))
        )
    tickets = {
        key.decode(): int(redis_client.hget(key, "n"))
        for key in redis_client.scan_iter("ci:{reports:*}:s")
    }
    assert tickets == {"ci:{reports:acme}:s": 3, "ci:{reports:globex}:s": 3}


def test_django_settings_snippet_reads_as_celery_interval_settings() -> None:
    app = Celery("django_like", set_as_current=False)
    sys.path.insert(0, str(EXAMPLES))
    try:
        app.config_from_object("django_settings", namespace="CELERY")
        settings = settings_of(app)
    finally:
        sys.path.remove(str(EXAMPLES))
    assert settings.queues_us == {"api": 1_000_000, "mail": 2_000_000}
    assert settings.store_url == "redis://localhost:6379/0"
    assert settings.max_held == 400
