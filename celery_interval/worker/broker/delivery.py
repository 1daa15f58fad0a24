"""Which queue a message was consumed from: the consumer's channel stamps it on delivery."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = [
    "QUEUE_KEY",
    "UNPARKED_KEY",
    "consumed_queue",
    "stamp_consumed_queues",
    "taken_back",
]

#: The ``delivery_info`` key naming the queue a message came from (set at every delivery).
QUEUE_KEY = "interval_queue"
#: The ``delivery_info`` key set on a parked task taken back from its overflow queue.
UNPARKED_KEY = "interval_unparked"


def stamp_consumed_queues(channel: Any) -> None:
    """Make every consumer started on ``channel`` stamp its queue's name on each delivery.

    Neither the AMQP delivery (exchange, routing key, consumer tag) nor kombu's virtual
    transports (Redis) say which queue a message was taken from, yet a topic or fanout
    exchange, ``task_routes`` or a per-call ``queue=``/``routing_key=`` decide it: the bucket
    must follow the queue. kombu's ``Queue.consume`` passes every argument by keyword.
    """
    if getattr(channel, "_interval_stamps", False):
        return
    basic_consume = channel.basic_consume

    def stamping_consume(*args: Any, **kwargs: Any) -> Any:
        queue, callback = kwargs.get("queue"), kwargs.get("callback")
        if isinstance(queue, str) and callback is not None:
            kwargs["callback"] = functools.partial(_stamp, queue, callback)
        return basic_consume(*args, **kwargs)

    channel.basic_consume = stamping_consume
    channel._interval_stamps = True


def _stamp(queue: str, callback: Callable[[Any], Any], message: Any) -> Any:
    info = getattr(message, "delivery_info", None)
    if isinstance(info, dict):
        info[QUEUE_KEY] = queue
    return callback(message)


def consumed_queue(message: Any) -> str | None:
    """The queue ``message`` was consumed from, or None where no stamp was made."""
    info = getattr(message, "delivery_info", None) or {}
    queue = info.get(QUEUE_KEY)
    return queue if isinstance(queue, str) else None


def taken_back(message: Any) -> bool:
    """Whether ``message`` was taken back from an overflow queue (never parked again)."""
    info = getattr(message, "delivery_info", None) or {}
    return bool(info.get(UNPARKED_KEY))
