"""What the fleet tells beyond the store: tasks each worker holds (``inspect interval_stats``)
and broker queue depths."""

from __future__ import annotations

from typing import Any

__all__ = ["held_per_worker", "queue_depths"]


def _not_found(exc: Exception) -> bool:
    """Whether a passive declare failed because the queue does not exist (AMQP 404; a Redis
    broker's queue with no message left reads so too): it holds no message."""
    code = getattr(exc, "reply_code", None) or getattr(exc, "code", None)
    return code == 404 or "NOT_FOUND" in str(exc)


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
    app: Any, timeout_s: float, buckets: list[str] | None = None, limit: int | None = None
) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Each answering worker's ``interval_stats`` of ``buckets`` (all when None; held counts,
    no task lists), waiting ``timeout_s``, or only until ``limit`` workers answered when
    given; and why the question failed (None when it did not)."""
    arguments: dict[str, Any] = {"top": 0, "tasks": 0}
    if buckets is not None:
        arguments["buckets"] = buckets
    try:
        replies = app.control.broadcast(
            "interval_stats", arguments=arguments, reply=True, timeout=timeout_s, limit=limit
        )
    except Exception as exc:
        return {}, f"cannot ask the workers: {exc}"
    answers: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    for reply in replies or ():
        for worker, stats in reply.items():
            if isinstance(stats, dict) and "error" not in stats:
                answers[worker] = stats
            else:
                errors.append(f"worker {worker}: {stats}")
    return answers, "; ".join(errors) or None
