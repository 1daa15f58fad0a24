"""A live worker's unacknowledged messages stay its own on a Redis broker: scores refreshed.

kombu's Redis transport scores each unacknowledged message in its ``unacked_index`` with the
time it was delivered, and any worker's ``restore_visible`` puts back in its queue every message
whose score is older than ``visibility_timeout``, whether its worker is dead or merely holding
it. An interval worker holds messages until their slot (a pause, a throttle or a long backlog
holds them longer), so without this each such message would be delivered again to another
worker as a copy while the first still waits. Every third of the timeout the worker moves the
scores of the messages its channel holds to now (``ZADD … XX``: an acknowledged message is never
written back). A dead worker refreshes nothing, so its messages come back a timeout after its
last refresh, as before: a ``restore_visible`` sweep puts them back, under kombu's lock
``unacked_mutex``. A sweeper that dies holding it (its broker killed mid-sweep) leaves the lock
for ``unacked_mutex_expire``, 300 s by default, and no worker sweeps meanwhile: the worker sets it
to ``UNACKED_MUTEX_EXPIRE_S`` unless the app did (``short_sweep_lock``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery_interval.worker.timer import cancel

__all__ = ["UNACKED_MUTEX_EXPIRE_S", "VisibilityRefresh", "refresh_every_s", "short_sweep_lock"]

logger = logging.getLogger("celery_interval.worker")

#: Tags per ``ZADD`` call.
BATCH = 1000
#: Refresh at least this often, and at most this often (seconds).
MIN_EVERY_S = 0.5
MAX_EVERY_S = 300.0
#: How long a sweep's lock outlives a sweeper that died holding it (kombu's default: 300 s).
#: Two sweeps at once are safe: each message goes back in a transaction watching its record.
UNACKED_MUTEX_EXPIRE_S = 10


def short_sweep_lock(app: Any) -> str | None:
    """On a Redis broker, ``unacked_mutex_expire`` of ``UNACKED_MUTEX_EXPIRE_S`` unless the app
    set one; what the banner says of it (None on another broker)."""
    url = str(app.conf.broker_url or "")
    if not url.startswith(("redis", "sentinel")):
        return None
    options = dict(app.conf.broker_transport_options or {})
    if "unacked_mutex_expire" in options:
        return f"unacked_mutex_expire={options['unacked_mutex_expire']} (set by the app)"
    options["unacked_mutex_expire"] = UNACKED_MUTEX_EXPIRE_S
    app.conf.broker_transport_options = options
    return f"unacked_mutex_expire={UNACKED_MUTEX_EXPIRE_S}"


def refresh_every_s(visibility_timeout_s: float) -> float:
    """A third of the timeout, within [MIN_EVERY_S, MAX_EVERY_S]."""
    return min(MAX_EVERY_S, max(MIN_EVERY_S, visibility_timeout_s / 3))


def _redis_qos(channel: Any) -> Any:
    """The channel's kombu Redis ``QoS`` (it has ``_delivered`` and the index key), or None on
    any other transport."""
    if channel is None or not isinstance(getattr(channel, "visibility_timeout", None), int | float):
        return None
    qos = getattr(channel, "_qos", None)
    if not isinstance(getattr(qos, "_delivered", None), dict):
        return None
    if not isinstance(getattr(channel, "unacked_index_key", None), str):
        return None
    return qos


class VisibilityRefresh:
    """Refreshes the ``unacked_index`` scores of one consumer channel's messages while it runs."""

    def __init__(self, timer: Any) -> None:
        self.timer = timer
        self._entry: Any = None
        self._channel: Any = None

    def start(self, channel: Any) -> None:
        """Begin with ``channel`` (again after a reconnect); nothing on a non-Redis broker."""
        self.stop()
        if _redis_qos(channel) is None:
            return
        self._channel = channel
        every_s = refresh_every_s(float(channel.visibility_timeout))
        self._entry = self.timer.call_repeatedly(every_s, self.refresh, priority=8)

    def stop(self) -> None:
        if self._entry is not None:
            cancel(self.timer, self._entry)
        self._entry = None
        self._channel = None

    def refresh(self) -> int:
        """Move every held message's score to now; returns how many tags were sent. A broker
        error skips this round (the consumer's own reconnect handles the outage)."""
        channel = self._channel
        qos = _redis_qos(channel)
        if qos is None:
            return 0
        tags = [str(tag) for tag in list(qos._delivered)]
        if not tags:
            return 0
        now_s = time.time()
        try:
            with channel.conn_or_acquire() as client:
                for at in range(0, len(tags), BATCH):
                    batch = tags[at : at + BATCH]
                    client.zadd(channel.unacked_index_key, dict.fromkeys(batch, now_s), xx=True)
        except Exception as exc:
            logger.debug("interval: unacked scores not refreshed this round: %r", exc)
            return 0
        return len(tags)
