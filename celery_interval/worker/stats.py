"""The reply to ``inspect interval_stats``: per-bucket figures of what a worker holds."""

from __future__ import annotations

import heapq
from collections import Counter
from fnmatch import fnmatchcase
from typing import Any

from celery_interval.config.values import limit_dict
from celery_interval.worker.broker.parking import Parking
from celery_interval.worker.holding import Holding

__all__ = ["interval_stats"]


def interval_stats(
    holding: Holding,
    parking: Parking | None,
    running: Counter[str],
    top: int,
    match: str | None,
    buckets: list[str] | None,
    tasks: int,
) -> dict[str, Any]:
    """The ``top`` buckets (0 = all) with the most held tasks, of those whose names match the
    glob ``match`` and are among ``buckets`` (when given), each listing its first ``tasks``
    held tasks by ticket and the bodies here holding a place of it (``running``, a capped
    bucket's); ``_buckets_total`` counts the buckets that matched."""
    counts = Counter({b: len(v) for b, v in holding.held.items()})
    names = set(holding.stats) | set(counts)
    if match is not None:
        names = {b for b in names if fnmatchcase(b, match)}
    if buckets is not None:
        names &= set(buckets)
    chosen = sorted(names, key=lambda b: (-counts.get(b, 0), b))
    out: dict[str, Any] = {}
    for bucket in chosen[:top] if top else chosen:
        st = holding.stats[bucket]
        held = holding.held.get(bucket, [])
        out[bucket] = {
            "interval_s": st.interval_us / 1e6,
            "burst": st.burst,
            "limits": [limit_dict(limit) for limit in st.limits],
            "paused": st.last_paused,
            "held": counts.get(bucket, 0),
            "running": running.get(bucket, 0),
            "held_tasks": [
                {"id": h.request.id, "ticket": h.ticket, "state": h.state.value, "cost": h.cost}
                for h in heapq.nsmallest(tasks, held, key=lambda h: h.ticket)
            ],
            "grants": st.grants,
            "claims": st.claims,
            "waits": st.waits,
            "retickets": st.retickets,
            "duplicates": st.duplicates,
            "held_by_other": st.helds,
            "paused_claims": st.paused,
        }
    out["_buckets_total"] = len(names)
    out["_queues_stopped"] = sorted(holding.stopped)
    if parking is not None:
        out["_overflow"] = parking.snapshot()
    return out
