"""What the fleet tells beyond the store: tasks each worker holds (``inspect interval_stats``)
and broker queue depths."""

from __future__ import annotations

from typing import Any

__all__ = ["held_per_worker", "queue_depths"]


def _not_found(exc: Exception) -> bool:
    """Whether a passive declare failed because the queue does not exist (AMQP 404; a Redis
    broker's queue with no message left reads so too)."""
    return getattr(exc, "reply_code", None) == 404 or "NOT_FOUND" in str(exc)


def queue_depths(app: Any, queues: list[str]) -> dict[str, int | None]:
    """Each queue's broker depth (0 for a queue the broker does not have, None where it does
    not answer), on one connection."""
    depths: dict[str, int | None] = dict.fromkeys(queues)
    if not queues:
        return depths
    try:
        with app.connection_for_read() as conn:
            for queue in queues:
                try:
                    channel = conn.channel()  # a failed passive declare closes its channel
                    try:
                        reply = channel.queue_declare(queue, passive=True)
                        depths[queue] = int(reply.message_count)
                    finally:
                        channel.close()
                except Exception as exc:
                    depths[queue] = 0 if _not_found(exc) else None
    except Exception:
        pass
    return depths


def held_per_worker(
    app: Any, timeout_s: float, buckets: list[str], limit: int | None = None
) -> dict[str, dict[str, Any]]:
    """Each worker's ``interval_stats`` of ``buckets`` (held counts only, no task lists),
    waiting ``timeout_s``, or only until ``limit`` workers answered when given."""
    try:
        replies = app.control.inspect(timeout=timeout_s, limit=limit)._request(
            "interval_stats", top=0, tasks=0, buckets=buckets
        )
        return replies or {}
    except Exception:
        return {}
