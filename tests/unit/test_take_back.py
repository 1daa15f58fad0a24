"""Taking a parked copy back from a Redis broker: one step, so a broker that dies in it loses
nothing (``worker.broker.redis_take``), on a private durable redis-server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import kombu
import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from celery_interval.buckets import overflow_queue_name
from celery_interval.demo.embedded import RedisProc
from celery_interval.worker.broker import brokerloss
from celery_interval.worker.broker.overflow_queues import ConsumerBroker

NAME = overflow_queue_name("api", "api")


@pytest.fixture
def broker_proc() -> Iterator[RedisProc]:
    """A broker that survives a SIGKILL with every write it answered (appendfsync always)."""
    proc = RedisProc(durable=True)
    try:
        yield proc
    finally:
        proc.stop()


def _copy(job: str) -> Any:
    return SimpleNamespace(
        body=json.dumps([[job], {}, {}]),
        headers={"id": job, "task": "t"},
        properties={},
        delivery_info={"exchange": "api", "routing_key": "api"},
        content_type="application/json",
        content_encoding="utf-8",
    )


def _parked(proc: RedisProc, jobs: list[str]) -> tuple[Any, ConsumerBroker]:
    """A worker's connection and its ConsumerBroker, with ``jobs`` parked in ``NAME``."""
    conn = kombu.Connection(proc.broker_url_for(1))
    channel = conn.channel()
    consumer = SimpleNamespace(task_consumer=SimpleNamespace(channel=channel, accept=None))
    consumer.connection = conn
    broker = ConsumerBroker(consumer)
    for job in jobs:
        broker.publish([(NAME, _copy(job), "api")], lambda error: None)
    return conn, broker


def _where(proc: RedisProc) -> tuple[set[str], set[str]]:
    """The jobs still queued in ``NAME``, and those recorded as unacknowledged."""
    with redis.Redis.from_url(proc.url_for(1)) as r:
        queued = {json.loads(m)["headers"]["id"] for m in r.lrange(NAME, 0, -1)}
        unacked = {json.loads(v)[0]["headers"]["id"] for v in r.hvals("unacked")}
    return queued, unacked


def test_a_broker_that_dies_as_a_copy_leaves_its_queue_loses_nothing(
    broker_proc: RedisProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker is SIGKILLed right after the command that took the copy off its queue: the
    copy must be in the queue or in the unacked records, which a worker's restore (or the
    visibility timeout) puts back. kombu's own get pops it, then records it, in separate
    round trips: the copy was in neither."""
    conn, broker = _parked(broker_proc, ["a", "b", "c"])
    assert broker.get(NAME).headers["id"] == "a"
    admin = redis.Redis.from_url(broker_proc.url_for(1))
    real = redis.Redis.execute_command

    def dies_once_b_left(self: Any, *args: Any, **kwargs: Any) -> Any:
        reply = real(self, *args, **kwargs)
        if self is admin:
            return reply
        if b'"id": "b"' not in b"".join(admin.lrange(NAME, 0, -1)):
            broker_proc.kill()
            raise RedisConnectionError("the broker died")
        return reply

    monkeypatch.setattr(redis.Redis, "execute_command", dies_once_b_left)
    with pytest.raises(RedisConnectionError):
        broker.get(NAME)
    monkeypatch.undo()
    broker_proc.restart()
    queued, unacked = _where(broker_proc)
    assert queued | unacked == {"a", "b", "c"}, (queued, unacked)
    conn.release()


def test_a_copy_taken_back_is_recorded_as_kombu_records_it(broker_proc: RedisProc) -> None:
    """The unacked record is kombu's (its restore reads it): a connection closed without the
    ack puts the copy back in its queue; an ack drops the record."""
    conn, broker = _parked(broker_proc, ["a", "b"])
    taken = broker.get(NAME)
    assert (taken.headers["id"], taken.payload) == ("a", [["a"], {}, {}])
    with redis.Redis.from_url(broker_proc.url_for(1)) as r:
        (record,) = r.hvals("unacked")
        payload, exchange, routing_key = json.loads(record)
        assert payload["properties"]["delivery_tag"] == taken.delivery_tag
        assert (exchange, routing_key) == ("", NAME)
        assert r.zscore("unacked_index", taken.delivery_tag) is not None
    second = broker.get(NAME)
    second.ack()
    assert _where(broker_proc) == (set(), {"a"})
    conn.release()  # closed unacknowledged: kombu restores the record
    assert _where(broker_proc) == ({"a"}, set())
    conn2, broker2 = _parked(broker_proc, [])
    assert broker2.get(NAME).headers["id"] == "a"
    assert broker2.get(NAME) is None
    conn2.release()


def test_a_task_popped_as_the_broker_went_goes_back_at_the_reconnect(
    broker_proc: RedisProc, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kombu pops a delivered message (BRPOP, RPOP), then records it as unacked in a round trip
    of its own; the broker SIGKILLed between the two left the message nowhere. The worker keeps
    it (``install_pop_rescue``) and puts it back at the head of its queue when the broker is
    back, as it does the messages its closed channel could not give back."""
    assert brokerloss.install_pop_rescue()
    monkeypatch.setattr(brokerloss, "_popped", [])  # this test's broker's, none other's
    conn, _ = _parked(broker_proc, ["a", "b"])
    real = redis.client.Pipeline.execute

    def dies_as_it_records(self: Any, *args: Any, **kwargs: Any) -> Any:
        broker_proc.kill()
        raise RedisConnectionError("the broker died")

    monkeypatch.setattr(redis.client.Pipeline, "execute", dies_as_it_records)
    channel = conn.default_channel
    with pytest.raises(RedisConnectionError):
        channel.basic_get(NAME, no_ack=False)  # kombu's virtual get: pop, then record
    monkeypatch.setattr(redis.client.Pipeline, "execute", real)
    broker_proc.restart()
    assert _where(broker_proc) == ({"b"}, set()), "a was in neither place"
    conn.release()
    conn2 = kombu.Connection(broker_proc.broker_url_for(1))
    consumer = SimpleNamespace(task_consumer=SimpleNamespace(channel=conn2.default_channel))
    assert brokerloss._restore_stranded(consumer) == (1, 0)
    assert _where(broker_proc) == ({"a", "b"}, set())
    with redis.Redis.from_url(broker_proc.url_for(1)) as r:
        head = json.loads(r.lindex(NAME, -1))  # BRPOP takes from this end: next delivered
        assert head["headers"]["id"] == "a" and head["headers"]["redelivered"]
    conn2.release()
