"""``celery -A tests.helpers.cliapp:app interval …`` run in-process, as a fixture."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from click.testing import CliRunner


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, redis_server: Any, redis_client: Any) -> Any:
    monkeypatch.setenv("CLI_TEST_BROKER", redis_server.broker_url_for(4))
    monkeypatch.setenv("CLI_TEST_STORE", redis_server.url_for(0))
    sys.modules.pop("tests.helpers.cliapp", None)
    from celery.bin.celery import celery

    def invoke(*args: str, input: str | None = None) -> Any:
        sys.modules.pop("tests.helpers.cliapp", None)
        return CliRunner().invoke(
            celery, ["-A", "tests.helpers.cliapp:app", "interval", *args], input=input
        )

    return invoke
