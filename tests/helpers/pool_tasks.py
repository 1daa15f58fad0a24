"""Tasks sent to a test pool, and the records its workers' bodies wrote, of one kind."""

from __future__ import annotations

from typing import Any

from tests.helpers.pool import Pool


def send_tenants(pool: Pool, calls: list[tuple[str, int]]) -> list[str]:
    """Send ``workerapp.tenant(key, i)`` for each call, in order; returns the task ids."""
    ids = []
    with pool.app.producer_or_acquire() as producer:
        for key, i in calls:
            result = pool.app.send_task(
                "workerapp.tenant", args=(key, i), queue=pool.queue, producer=producer
            )
            ids.append(result.id)
    return ids


def kinds(pool: Pool, kind: str) -> list[dict[str, Any]]:
    """The records of ``kind`` the bodies wrote, earliest start first."""
    return sorted((r for r in pool.records() if r["kind"] == kind), key=lambda r: r["us"])
