"""The broker side of parking: overflow queues on the worker's own connection."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import kombu

from celery_interval.headers import PARKED_HEADER
from celery_interval.worker.broker.delivery import QUEUE_KEY, UNPARKED_KEY
from celery_interval.worker.broker.redis_take import is_redis_channel, take_back

__all__ = ["ConsumerBroker", "OverflowBroker", "ack_each", "log_trail"]

logger = logging.getLogger("celery_interval.worker")
#: The task ids of what parks, comes back and returns to the broker, at DEBUG: the trail of
#: a task that went missing (``logging.getLogger("celery_interval.worker.parking")``).
trail = logging.getLogger("celery_interval.worker.parking")

_kombu: Any = kombu  # its entities are untyped

#: The durable queue (never expiring) holding one entry per bucket that has parked tasks.
DIRECTORY_QUEUE = "ci-overflow-directory"
#: An overflow queue nobody used (no get, no declare) this long is deleted by RabbitMQ.
EXPIRES_MS = 7 * 24 * 3600 * 1000
#: A RabbitMQ node killed within about 2 s of a durable queue's declaration may come back
#: without the queue, and so without the copies it confirmed into it: the originals of copies
#: parked in a queue first declared on this connection less than this ago wait to be acked.
QUEUE_SETTLE_S = 3.0


class OverflowBroker(Protocol):
    """The broker side of parking, on the worker's own connection (``ConsumerBroker`` below)."""

    def publish(
        self, copies: list[tuple[str, Any, str]], settled: Callable[[Exception | None], None]
    ) -> None:
        """Publish each ``(overflow queue, message, origin queue)`` copy, durably; call
        ``settled(None)`` once the broker has them all, ``settled(error)`` if it refused one
        (raise if a publish failed at once)."""
        ...

    def get(self, name: str) -> Any:
        """The head message of overflow queue ``name``, unacknowledged, or None if empty."""
        ...

    def deliver(self, message: Any, queue: str) -> None:
        """Hand ``message`` to the worker's task handler as if consumed from ``queue``."""
        ...

    def consumes(self, queue: str) -> bool:
        """Whether this worker consumes ``queue`` now."""
        ...

    def returns_unacked_within_s(self) -> float:
        """At most how long after this worker dies its unacked messages are back in their
        queues."""
        ...

    def close(self) -> None:
        """Let go of what it opened (the connection is gone or going)."""
        ...

    def register(self, entries: list[str]) -> None:
        """Publish each entry to the overflow directory (durably, not waited for)."""
        ...

    def take_entry(self) -> Any:
        """The directory's head entry, unacknowledged, or None if it is empty."""
        ...

    def depth(self, name: str) -> int:
        """How many ready tasks overflow queue ``name`` has (declaring it renews its expiry)."""
        ...


def _queue(name: str) -> Any:
    return _kombu.Queue(
        name,
        _kombu.Exchange(""),
        routing_key=name,
        durable=True,
        auto_delete=False,
        queue_arguments=None if name == DIRECTORY_QUEUE else {"x-expires": EXPIRES_MS},
    )


def log_trail(event: str, messages: Iterable[Any]) -> None:
    """Log ``event`` with the task ids of ``messages`` (kombu messages) at DEBUG, one line."""
    if trail.isEnabledFor(logging.DEBUG):
        ids = [_task_id(m) for m in messages]
        if ids:
            trail.debug("interval: %s %d: %s", event, len(ids), " ".join(ids))


def _task_id(message: Any) -> str:
    """A message's task id: its protocol 2 header, else its protocol 1 correlation id."""
    headers = getattr(message, "headers", None) or {}
    properties = getattr(message, "properties", None) or {}
    return str(headers.get("id") or properties.get("correlation_id"))


def ack_each(messages: list[tuple[str, Any]]) -> None:
    """Ack each ``(bucket, message)`` on its own: an ack the connection refuses leaves that
    message with the broker (redelivered with the connection; a parked original's copy is then
    dropped as a duplicate), never the rest unacked."""
    refused: list[str] = []
    for bucket, message in messages:
        try:
            message.ack()
        except Exception as exc:
            refused.append(f"{bucket} ({exc})")
    if refused:
        logger.warning(
            "interval: %d parked original(s) not acked, the broker redelivers them: %s",
            len(refused),
            refused[0],
        )


def _parked_from(message: Any, origin: str) -> dict[str, Any]:
    """How the task was delivered before it parked: what a retry, ``replace``, a throttled
    resend or ``Reject(requeue=True)`` derive their routing from must not name the overflow."""
    info = message.delivery_info or {}
    return {
        "queue": origin,
        "exchange": info.get("exchange", ""),
        "routing_key": info.get("routing_key", origin),
        "redelivered": bool(info.get("redelivered", False)),
    }


def _delivered_as(message: Any, queue: str) -> dict[str, Any]:
    """The ``delivery_info`` fields a parked copy had before it parked (see ``_parked_from``)."""
    parked = (message.headers or {}).get(PARKED_HEADER)
    if not isinstance(parked, dict):
        return {"exchange": "", "routing_key": queue}
    return {
        "exchange": str(parked.get("exchange", "")),
        "routing_key": str(parked.get("routing_key") or queue),
        "redelivered": bool(parked.get("redelivered"))
        or bool(message.delivery_info.get("redelivered")),
    }


@dataclass
class _Waiting:
    """A batch of publishes awaiting the broker's confirms: tags ``first`` to ``last``."""

    first: int
    last: int
    settled: Callable[[Exception | None], None]
    refused: bool = False


class _Confirms:
    """Publisher confirms of one AMQP channel: each batch is settled as the event loop reads
    the broker's acks (never waited for in a blocking call)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.sent = 0
        self._upto = 0
        self._single: set[int] = set()
        self._waiting: list[_Waiting] = []
        channel.confirm_select()
        channel.events["basic_ack"].add(self._ack)
        channel.events["basic_nack"].add(self._nack)

    def when_confirmed(self, first: int, settled: Callable[[Exception | None], None]) -> None:
        """Call ``settled`` once publishes ``first`` to ``sent`` are all confirmed."""
        self._waiting.append(_Waiting(first, self.sent, settled))
        self._settle()

    def _ack(self, tag: int, multiple: bool) -> None:
        if multiple:
            self._upto = max(self._upto, tag)
        else:
            self._single.add(tag)
        while self._upto + 1 in self._single:
            self._upto += 1
            self._single.discard(self._upto)
        self._settle()

    def _nack(self, tag: int, multiple: bool) -> None:
        for waiting in self._waiting:
            if waiting.first <= tag and (multiple or tag <= waiting.last):
                waiting.refused = True
        self._ack(tag, multiple)

    def _settle(self) -> None:
        while self._waiting and self._waiting[0].last <= self._upto:
            waiting = self._waiting.pop(0)
            refused = RuntimeError("the broker refused a parked copy (basic.nack)")
            waiting.settled(refused if waiting.refused else None)


class ConsumerBroker:
    """Parks on a channel of its own (with publisher confirms on AMQP); takes parked tasks
    back on the task consumer's channel, so they are acked, rejected and redelivered as any
    task message is (a worker that dies returns them to the head of their overflow queue)."""

    def __init__(self, consumer: Any) -> None:
        self._c = consumer
        self._channel: Any = None
        self._producer: Any = None
        self._confirms: _Confirms | None = None
        #: When each queue was first declared on the publishing channel (monotonic s).
        self._declared: dict[str, float] = {}
        self._declared_get: set[str] = set()

    def _ready(self) -> Any:
        if self._producer is None:
            self._channel = self._c.connection.channel()
            if hasattr(self._channel, "confirm_select") and hasattr(self._channel, "events"):
                self._confirms = _Confirms(self._channel)
            self._producer = _kombu.Producer(
                self._channel, exchange=_kombu.Exchange(""), auto_declare=False
            )
        return self._producer

    def publish(
        self, copies: list[tuple[str, Any, str]], settled: Callable[[Exception | None], None]
    ) -> None:
        producer = self._ready()
        first = self._confirms.sent + 1 if self._confirms is not None else 0
        for name, message, origin in copies:
            if name not in self._declared:
                _queue(name).bind(self._channel).declare()
                self._declared[name] = time.monotonic()
            properties = message.properties or {}
            priority = properties.get("priority")
            if priority is None:
                priority = (message.delivery_info or {}).get("priority")
            producer.publish(
                message.body,
                routing_key=name,
                headers={**(message.headers or {}), PARKED_HEADER: _parked_from(message, origin)},
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                delivery_mode=2,
                priority=priority,
                correlation_id=properties.get("correlation_id"),
                reply_to=properties.get("reply_to"),
                retry=False,
            )
            if self._confirms is not None:
                self._confirms.sent += 1
        if self._confirms is None:
            settled(None)  # Redis: each publish returned once the broker had it
        else:
            names = [name for name, _message, _origin in copies]
            self._confirms.when_confirmed(first, functools.partial(self._kept, names, settled))

    def _kept(
        self, names: list[str], settled: Callable[[Exception | None], None], refused: Any
    ) -> None:
        """The broker confirmed (or refused) a batch: settle it once its queues are old enough
        to outlive a crash of the broker (``QUEUE_SETTLE_S``)."""
        wait_s = 0.0 if refused is not None else self.young_for_s(names)
        if wait_s > 0:
            self._c.timer.call_after(wait_s, settled, (None,), priority=6)
        else:
            settled(refused)

    def get(self, name: str) -> Any:
        consumer = self._c.task_consumer
        queue = _queue(name).bind(consumer.channel)
        if name not in self._declared_get:  # a get from a queue that is not there closes it
            queue.declare()
            self._declared_get.add(name)
        if is_redis_channel(consumer.channel):
            return take_back(consumer.channel, name, consumer.accept)
        return queue.get(no_ack=False, accept=consumer.accept)

    def register(self, entries: list[str]) -> None:
        producer = self._ready()
        if DIRECTORY_QUEUE not in self._declared:
            _queue(DIRECTORY_QUEUE).bind(self._channel).declare()
            self._declared[DIRECTORY_QUEUE] = time.monotonic()
        for entry in entries:
            producer.publish(
                entry,
                routing_key=DIRECTORY_QUEUE,
                content_type="application/json",
                content_encoding="utf-8",
                serializer=None,
                delivery_mode=2,
                retry=False,
            )
            if self._confirms is not None:
                self._confirms.sent += 1  # its tag counts; nobody waits for it

    def take_entry(self) -> Any:
        return self.get(DIRECTORY_QUEUE)

    def depth(self, name: str) -> int:
        channel = self._c.task_consumer.channel
        _, ready, _ = _queue(name).bind(channel).queue_declare()
        return int(ready)

    def deliver(self, message: Any, queue: str) -> None:
        info = message.delivery_info
        info.update(_delivered_as(message, queue))
        info[QUEUE_KEY] = queue
        info[UNPARKED_KEY] = True
        on_message = self._c.task_consumer.on_message
        if on_message is None:  # pragma: no cover - the loop sets it before any timer runs
            message.requeue()
            return
        on_message(message)

    def young_for_s(self, names: Iterable[str]) -> float:
        """How long until each named queue was first declared ``QUEUE_SETTLE_S`` ago on the
        publishing channel (one not declared there counts as declared now)."""
        now_s = time.monotonic()
        return max(
            (self._declared.get(name, now_s) + QUEUE_SETTLE_S - now_s for name in names),
            default=0.0,
        )

    def returns_unacked_within_s(self) -> float:
        """AMQP returns a dead worker's unacked messages as its connection closes; kombu's Redis
        transport restores them after its visibility timeout, found by a periodic sweep."""
        channel = getattr(self._c.task_consumer, "channel", None)
        visibility_s = getattr(channel, "visibility_timeout", None)
        if not isinstance(visibility_s, int | float):
            return 0.0
        sweep_s = getattr(channel, "unacked_restore_interval", 0) * getattr(
            channel, "unacked_restore_throttle", 1
        )
        return float(visibility_s) + float(sweep_s)

    def consumes(self, queue: str) -> bool:
        consumer = self._c.task_consumer
        return consumer is not None and bool(consumer.consuming_from(queue))

    def close(self) -> None:
        """Drop the publishing channel (the connection it was on is gone or going)."""
        channel, self._channel, self._producer, self._confirms = self._channel, None, None, None
        self._declared.clear()
        self._declared_get.clear()
        if channel is not None:
            try:
                channel.close()
            except Exception:  # the connection is already gone
                logger.debug("interval: overflow channel already closed", exc_info=True)
