"""Parking's broker side on a real RabbitMQ: a confirmed copy counts as kept only once its
overflow queue is old enough to outlive a crash of the node."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kombu import Connection

from celery_interval.worker.broker import overflow_queues
from celery_interval.worker.broker.overflow_queues import ConsumerBroker
from tests.helpers.brokers import rabbitmq_url
from tests.helpers.fakes import Timer


@pytest.fixture
def amqp() -> Iterator[Connection]:
    with Connection(rabbitmq_url()) as conn:
        yield conn


def _message(task_id: str) -> Any:
    return SimpleNamespace(
        body=b"[[], {}, {}]",
        headers={"id": task_id, "task": "t"},
        properties={},
        delivery_info={},
        content_type="application/json",
        content_encoding="utf-8",
    )


def _publish(broker: ConsumerBroker, conn: Connection, name: str, task_id: str) -> list[Any]:
    """Publish one copy into ``name``; return what ``settled`` got once the broker confirmed."""
    got: list[Any] = []
    broker.publish([(name, _message(task_id), "api")], got.append)
    deadline = time.monotonic() + 10
    while not broker._confirms or broker._confirms._upto < broker._confirms.sent:
        assert time.monotonic() < deadline, "no confirm from the broker"
        conn.drain_events(timeout=1)
    return got


def test_a_copy_in_a_queue_declared_just_now_settles_once_the_queue_is_old_enough(
    amqp: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RabbitMQ may lose a durable queue declared within about 2 s of a node kill, with what
    it confirmed into it: the first copy's original is settled only after QUEUE_SETTLE_S; a
    copy into the same queue once it is that old settles as the confirm arrives."""
    monkeypatch.setattr(overflow_queues, "QUEUE_SETTLE_S", 0.5)
    timer = Timer()
    broker = ConsumerBroker(SimpleNamespace(connection=amqp, timer=timer))
    name = f"ci-test-young-{uuid.uuid4().hex[:8]}"
    try:
        first = _publish(broker, amqp, name, "a")
        assert first == [], "settled while its queue is new"
        [entry] = timer.entries
        delay_s, _fn, _args = entry
        assert 0 < delay_s <= 0.5  # what is left of the 0.5 s after the confirm came
        timer.run()
        assert first == [None]
        time.sleep(0.5)
        assert _publish(broker, amqp, name, "b") == [None]
        assert timer.entries == []
    finally:
        amqp.default_channel.queue_delete(name)
        broker.close()
