"""Figures of one run from recorded body starts and the bucket's ledger (claims, pauses)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from celery_interval.starts import happened, is_violation

__all__ = ["RunFigures", "body_slack_us", "figures_from", "percentile"]


@dataclass(frozen=True)
class RunFigures:
    """What a run achieved; the interval holds when ``violations`` is 0."""

    tasks: int
    completed: int
    duplicates: int
    violations: int
    min_gap_s: float
    interval_s: float
    workers: int
    utilization: float
    p99_lateness_s: float
    body_min_gap_s: float
    paused_s: float
    claims: int
    p50_lateness_s: float
    body_below_floor: int
    store_calls_per_task: float
    body_utilization: float
    body_gaps_below_90pct: int
    body_gap_p1_s: float
    body_gap_p50_s: float
    body_gap_p99_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def figures_from(
    records: Iterable[bytes | str],
    ledger: Iterable[tuple[Any, dict[Any, Any]]],
    *,
    tasks: int,
    interval_s: float,
    workers: int,
    since_us: int = 0,
    store_calls: int = 0,
) -> RunFigures:
    """Exactly-once from the body records; spacing, lateness and pauses from the ledger."""
    starts = [json.loads(r) for r in records]
    ids = [s["id"] for s in starts]
    # One host's monotonic clock when every worker recorded it (the demo), else the store's.
    clock = "mono_ns" if starts and all("mono_ns" in s for s in starts) else "us"
    body_times = sorted(s[clock] // (1000 if clock == "mono_ns" else 1) for s in starts)
    entries = [{_text(k): _text(v) for k, v in fields.items()} for _entry_id, fields in ledger]
    entries = [e for e in entries if int(e.get("now") or 0) >= since_us]
    claims = sorted((int(e.get("start") or 0), int(e.get("late") or 0)) for e in happened(entries))
    pauses = [(e["op"], int(e["now"])) for e in entries if e.get("op") in ("pause", "unpause")]
    claim_times = [t for t, _ in claims]
    interval_us = round(interval_s * 1e6)
    gaps = [b - a for a, b in itertools.pairwise(claim_times)]
    body_gaps = [b - a for a, b in itertools.pairwise(body_times)]
    paused_us = _paused_us(pauses, claim_times)
    span_us = (claim_times[-1] - claim_times[0] - paused_us) if len(claim_times) > 1 else 0
    return RunFigures(
        tasks=tasks,
        completed=len(set(ids)),
        duplicates=len(ids) - len(set(ids)),
        violations=sum(1 for g in gaps if is_violation(g, interval_us)),
        min_gap_s=min(gaps) / 1e6 if gaps else math.nan,
        interval_s=interval_s,
        workers=workers,
        utilization=(len(claim_times) - 1) * interval_us / span_us if span_us > 0 else math.nan,
        p99_lateness_s=percentile([late / 1e6 for _, late in claims], 99),
        body_min_gap_s=min(body_gaps) / 1e6 if body_gaps else math.nan,
        paused_s=paused_us / 1e6,
        claims=len(claims),
        p50_lateness_s=percentile([late / 1e6 for _, late in claims], 50),
        body_below_floor=sum(1 for g in body_gaps if g < interval_us - body_slack_us(interval_us)),
        store_calls_per_task=store_calls / tasks if tasks else math.nan,
        body_utilization=(len(body_times) - 1) * interval_us / (body_times[-1] - body_times[0])
        if len(body_times) > 1 and body_times[-1] > body_times[0]
        else math.nan,
        body_gaps_below_90pct=sum(1 for g in body_gaps if g < 0.9 * interval_us),
        body_gap_p1_s=percentile(body_gaps, 1) / 1e6,
        body_gap_p50_s=percentile(body_gaps, 50) / 1e6,
        body_gap_p99_s=percentile(body_gaps, 99) / 1e6,
    )


def body_slack_us(interval_us: int) -> int:
    """What OS scheduling may take off a gap between body starts: max(10 %, 3 ms)."""
    return max(interval_us // 10, 3_000)


def _paused_us(pauses: list[tuple[str, int]], claim_times: list[int]) -> int:
    """Paused time that falls between the first and the last claim."""
    if len(claim_times) < 2:
        return 0
    first, last = claim_times[0], claim_times[-1]
    total, since = 0, None
    for op, now in sorted(pauses, key=lambda p: p[1]):
        if op == "pause" and since is None:
            since = now
        elif op == "unpause" and since is not None:
            total += max(0, min(now, last) - max(since, first))
            since = None
    return total
