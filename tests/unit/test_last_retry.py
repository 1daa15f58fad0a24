"""An interval task's retry waits for a broker that is down only when Celery will send it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import MaxRetriesExceededError

from celery_interval import IntervalTask


def _app() -> Celery:
    # Nothing listens on port 1: a connection under the waiting policy would wait forever.
    app = Celery("last_retry", broker="amqp://guest:guest@127.0.0.1:1//", set_as_current=False)
    app.conf.interval_store_url = "memory://"
    app.conf.broker_connection_timeout = 0.2
    return app


def _retry_in_thread(task: Any, retries: int, **options: Any) -> list[BaseException]:
    raised: list[BaseException] = []

    def run() -> None:
        task.push_request(id="t1", retries=retries, called_directly=False, is_eager=False)
        try:
            task.retry(**options)
        except BaseException as exc:
            raised.append(exc)
        finally:
            task.pop_request()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the last retry waited for the broker"
    return raised


@pytest.mark.parametrize("where", ["task", "call"])
def test_a_task_past_its_last_retry_fails_at_once_with_the_broker_down(where: str) -> None:
    app = _app()
    declared = {"max_retries": 2} if where == "task" else {}

    @app.task(base=IntervalTask, bind=True, shared=False, name="t.last", **declared)
    def last(self: Any) -> None:
        return None

    options = {} if where == "task" else {"max_retries": 2}
    (raised,) = _retry_in_thread(last, retries=2, exc=ValueError("boom"), **options)
    assert isinstance(raised, ValueError)
    (raised,) = _retry_in_thread(last, retries=2, **options)
    assert isinstance(raised, MaxRetriesExceededError)


def test_the_retry_is_sent_as_celery_decides() -> None:
    """``max_retries`` of the call, else the task's; None (the call's) means the task's."""
    app = _app()

    @app.task(base=IntervalTask, bind=True, shared=False, name="t.more", max_retries=5)
    def more(self: Any) -> None:
        return None

    assert more._retry_is_sent((), {})  # type: ignore[attr-defined]
    more.push_request(id="t2", retries=5, called_directly=False)
    try:
        assert not more._retry_is_sent((), {})  # type: ignore[attr-defined]
        assert more._retry_is_sent((), {"max_retries": 9})  # type: ignore[attr-defined]
        assert not more._retry_is_sent((), {"max_retries": None})  # type: ignore[attr-defined]
        more.max_retries = None
        assert more._retry_is_sent((), {})  # type: ignore[attr-defined]
    finally:
        more.pop_request()
