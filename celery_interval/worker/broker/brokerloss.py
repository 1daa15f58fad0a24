"""Survive a broker that goes away: the Redis restore-at-close workaround, outage log lines."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery.bootsteps import RUN

__all__ = [
    "BrokerWatch",
    "ack_through",
    "install_pop_rescue",
    "install_restore_fix",
    "restore_bug_present",
]

logger = logging.getLogger("celery_interval.worker")

#: Delivery tags whose restore at a channel close could not reach the broker, with when that
#: was noted (time.time(), the clock kombu scores its ``unacked_index`` with).
_stranded: dict[str, float] = {}
#: Of those, the tags this worker had acknowledged (its ack never reached the broker): the
#: message ran, so at the reconnect its ack is completed instead of the message put back.
_acked_stranded: set[str] = set()
#: Delivery tags whose ack was sent and did not complete: the connection went meanwhile.
_unfinished_acks: set[str] = set()
#: kombu's own ``Channel._connparams`` once the workaround replaced it.
_original_connparams: Any = None
#: Messages a Redis channel popped whose unacked record could not be written (the broker went
#: between the two round trips): (payload, exchange, routing_key). They exist nowhere else and
#: go back to the head of their queues at the reconnect.
_popped: list[tuple[Any, str, str]] = []
#: kombu's own Redis ``QoS.append`` once ``install_pop_rescue`` wrapped it.
_original_append: Any = None


def restore_bug_present() -> bool:
    """Whether the installed kombu has the bug, found by behaviour: its Redis
    ``Channel._connparams`` on a channel whose transport lost its client
    (``Connection.collect`` sets ``transport.client = None``, a close sets
    ``channel.connection = None``) raises ``AttributeError`` (``conninfo.hostname`` of None),
    which no caller expects, instead of a connection error. The probe runs kombu's own method
    on a bare channel; it fails before any I/O, so no server is needed."""
    try:
        from kombu.transport import redis as kredis
    except ImportError:  # redis-py missing: no Redis transport, no bug to meet
        return False
    channel: Any = object.__new__(kredis.Channel)
    channel.connection = type("GoneTransport", (), {"client": None, "default_port": 6379})()
    connparams: Any = _original_connparams or kredis.Channel._connparams
    try:
        connparams(channel)
    except AttributeError as exc:
        return "'NoneType' object has no attribute" in str(exc)
    except Exception:
        return False
    return False


def install_restore_fix() -> bool:
    """Patch ``kombu.transport.redis.Channel._connparams`` (that one call) if the installed
    kombu has the bug: on a channel whose broker connection is gone it raises redis-py's
    ``ConnectionError``, which kombu and Celery handle (the restore at close then leaves the
    messages in the broker's ``unacked`` hash; a late ack is logged as failed), instead of an
    ``AttributeError`` that stops the worker. Returns whether the patch is in force."""
    global _original_connparams
    if _original_connparams is not None:
        return True
    if not restore_bug_present():
        return False
    import kombu
    from kombu.transport import redis as kredis
    from redis.exceptions import ConnectionError as RedisConnectionError

    original: Any = kredis.Channel._connparams

    def _connparams(self: Any, asynchronous: bool = False) -> Any:
        transport = self.connection
        if transport is None or transport.client is None:
            raise RedisConnectionError("the broker connection of this channel is closed")
        return original(self, asynchronous=asynchronous)

    _original_connparams = original
    kredis.Channel._connparams = _connparams  # type: ignore[method-assign]
    logger.info(
        "interval: kombu %s stops a Redis worker at a broker outage (Channel._connparams "
        "raises AttributeError on a closed channel): patched to raise ConnectionError",
        kombu.__version__,
    )
    return True


def ack_through(message: Any, ack: Callable[[], None]) -> None:
    """Run ``ack`` (Celery's, which logs a failure instead of raising) for ``message``; if it
    did not complete, the tag is remembered, so that a broker outage does not put back a
    message that already ran."""
    tag = str(getattr(message, "delivery_tag", ""))
    _unfinished_acks.add(tag)
    try:
        ack()
    finally:
        if getattr(message, "acknowledged", False):
            _unfinished_acks.discard(tag)


def _note_unrestored(c: Any) -> int:
    """Note the delivery tags the closed channel could not give back: kombu's Redis restore at
    close empties its QoS's ``_delivered`` only once every message went back, so what is left
    there stayed in the broker's ``unacked`` hash. Returns how many."""
    channel = getattr(getattr(c, "task_consumer", None), "channel", None)
    qos: Any = getattr(channel, "_qos", None)
    delivered = getattr(qos, "_delivered", None)
    if not delivered or not hasattr(qos, "restore_by_tag"):
        return 0
    noted_at_s = time.time()
    tags = set(map(str, delivered))
    _stranded.update(dict.fromkeys(tags, noted_at_s))
    _acked_stranded.update(tags & _unfinished_acks)
    _unfinished_acks.clear()  # what the closed channel did not hold, no reconnect can complete
    return len(tags)


def install_pop_rescue() -> bool:
    """Wrap kombu's Redis ``QoS.append`` (that one call), which records a message its channel
    popped (BRPOP, RPOP) in the ``unacked`` hash in a round trip of its own: when that write
    fails on a broker connection error, the message is kept here for ``_restore_stranded``
    instead of lost. Returns False where kombu has no Redis transport."""
    global _original_append
    if _original_append is not None:
        return True
    try:
        from kombu.transport import redis as kredis
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:
        return False
    original: Any = kredis.QoS.append

    def append(self: Any, message: Any, delivery_tag: Any) -> Any:
        try:
            return original(self, message, delivery_tag)
        except (RedisConnectionError, RedisTimeoutError, OSError):
            delivery = message.delivery_info
            _popped.append((message._raw, delivery["exchange"], delivery["routing_key"]))
            raise

    _original_append = original
    kredis.QoS.append = append  # type: ignore[method-assign]
    return True


def _restore_popped(channel: Any, client: Any) -> int:
    """Push the messages popped as the broker went (``install_pop_rescue``) back to the head
    of their queues; returns how many."""
    restored = 0
    while _popped:
        payload, exchange, routing_key = _popped[0]
        channel._do_restore_message(payload, exchange, routing_key, client, leftmost=False)
        _popped.pop(0)
        restored += 1
    return restored


def _restore_stranded(c: Any) -> tuple[int, int]:
    """Put the messages this worker held at the outage (and those it popped as the broker
    went: ``install_pop_rescue``) back at the head of their queues, now that the broker
    answers, and complete the acks that did not reach it (those messages ran:
    put back, a copy would run again if the store lost its done mark meanwhile), each unless
    it changed hands since (its ``unacked_index`` score is newer: another worker's
    ``restore_visible`` restored it and it was delivered again). Returns how many went back
    and how many acks were completed; tags that could not be handled stay for the next time."""
    if not _stranded and not _popped:
        return 0, 0
    channel = getattr(getattr(c, "task_consumer", None), "channel", None)
    qos: Any = getattr(channel, "qos", None)
    if channel is None or not hasattr(qos, "restore_by_tag"):
        return 0, 0
    restored = completed = 0
    with channel.conn_or_acquire() as client:
        restored += _restore_popped(channel, client)
        for tag, noted_at_s in list(_stranded.items()):
            score = client.zscore(channel.unacked_index_key, tag)
            if score is not None and score <= noted_at_s:
                if tag in _acked_stranded:
                    client.pipeline().zrem(channel.unacked_index_key, tag).hdel(
                        channel.unacked_key, tag
                    ).execute()
                    completed += 1
                else:
                    qos.restore_by_tag(tag, client=client)
                    restored += 1
            del _stranded[tag]
            _acked_stranded.discard(tag)
    return restored, completed


class BrokerWatch:
    """One log line when a consumer loses the broker, one when it is back (with how long and
    what came back); the Redis messages the closed channel could not give back go back then."""

    def __init__(self) -> None:
        self.lost_at_s: float | None = None

    def stopped(self, c: Any) -> None:
        """The consumer stops: a restart (the blueprint still running) is a broker outage; a
        shutdown stops the blueprint first and is none."""
        if getattr(c.blueprint, "state", None) != RUN:
            return
        unrestored = _note_unrestored(c)
        if self.lost_at_s is not None:
            return
        self.lost_at_s = time.monotonic()
        logger.warning(
            "interval: broker connection lost; tasks wait until it is back (%d unacked "
            "message(s) to put back)",
            unrestored,
        )

    def started(self, c: Any) -> None:
        """The consumer is connected again: restore what the outage stranded, say so once."""
        try:
            restored, completed = _restore_stranded(c)
        except Exception as exc:
            logger.warning("interval: could not put stranded messages back yet: %r", exc)
            restored = completed = 0
        if self.lost_at_s is None:
            return
        down_s = time.monotonic() - self.lost_at_s
        self.lost_at_s = None
        logger.warning(
            "interval: broker connection back after %.1fs; %d stranded message(s) put back, "
            "%d ack(s) of tasks that ran completed",
            down_s,
            restored,
            completed,
        )
