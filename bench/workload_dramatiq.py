"""The Dramatiq side of the bench workload: the same body behind Dramatiq's Redis rate limiter.

Run by the bench as ``dramatiq workload_dramatiq -p W -t 2`` with ``bench/`` on PYTHONPATH.
The pattern is Dramatiq's documented one: ``with limiter.acquire():`` raises
``RateLimitExceeded`` when the slot is taken and the Retries middleware re-enqueues the message
with exponential backoff. ``BucketRateLimiter(limit=1, bucket=interval_ms)`` is the limiter
that can express a sub-second interval (``WindowRateLimiter`` counts whole seconds).
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Middleware
from dramatiq.rate_limits import BucketRateLimiter
from dramatiq.rate_limits.backends import RedisBackend
from recording import ENV_BROKER, ENV_STORE, QUEUE, interval_s, record_ready, record_start, recorder

INTERVAL_MS = max(1, round(interval_s() * 1000))
#: Backoff of a refused message: from one interval, doubling, capped at ten intervals, never
#: given up (Dramatiq's defaults, 15 s to 7 days and 20 retries, would stretch a 10 ms schedule
#: to hours and drop messages). ``BENCH_DRAMATIQ_MAX_BACKOFF_MS`` overrides the cap.
MIN_BACKOFF_MS = INTERVAL_MS
MAX_BACKOFF_MS = int(os.environ.get("BENCH_DRAMATIQ_MAX_BACKOFF_MS") or 10 * INTERVAL_MS)


class _Ready(Middleware):
    """Opens the connections before the first message, then tells the bench."""

    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        recorder()
        BACKEND.client.ping()
        record_ready("dramatiq-process")


broker = RedisBroker(url=os.environ[ENV_BROKER])
broker.add_middleware(CurrentMessage())
broker.add_middleware(_Ready())
dramatiq.set_broker(broker)

BACKEND = RedisBackend(url=os.environ[ENV_STORE])
LIMITER = BucketRateLimiter(BACKEND, "bench-interval", limit=1, bucket=INTERVAL_MS)


@dramatiq.actor(
    actor_name="bench_limited",
    queue_name=QUEUE,
    min_backoff=MIN_BACKOFF_MS,
    max_backoff=MAX_BACKOFF_MS,
    max_retries=None,
)
def limited(i: int) -> int:
    """At most one start per bucket of ``INTERVAL_MS``; refused messages retry with backoff."""
    with LIMITER.acquire():
        message = CurrentMessage.get_current_message()
        assert message is not None
        retries = int(message.options.get("retries", 0))
        record_start(message.message_id, i, retries, str(os.getpid()))
    return i
