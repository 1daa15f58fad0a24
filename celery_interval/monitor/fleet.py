"""What the fleet tells beyond the store: tasks each worker holds (``inspect interval_stats``)
and broker queue depths."""

from __future__ import annotations

from typing import Any

__all__ = ["held_per_worker", "queue_depths"]


def queue_depths(app: Any, queues: list[str]) -> dict[str, int | None]:
    """Each queue's broker depth (None where the broker does not answer), on one connection."""
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
                except Exception:
                    depths[queue] = None
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
