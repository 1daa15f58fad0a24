"""``interval top``'s frame: the busiest buckets as a rich table or one JSON object."""

from __future__ import annotations

from typing import Any

from celery_interval.monitor.collector import BucketRow, Frame

__all__ = ["busiest", "frame_json", "frame_table"]


def busiest(frame: Frame, top: int) -> list[BucketRow]:
    """The ``top`` rows (0 = all) with the highest start rate, then waiting, then held."""
    rows = sorted(frame.rows, key=lambda r: (-r.rate_per_s, -(r.waiting or 0), -r.held, r.bucket))
    return rows[:top] if top else rows


def frame_json(frame: Frame, top: int) -> dict[str, Any]:
    """One JSON-ready frame: the shown rows, and how many buckets there are."""
    rows = busiest(frame, top)
    return {
        "buckets": [row.as_dict() for row in rows],
        "total": len(frame.rows),
        "shown": len(rows),
        "window_s": frame.window_s,
        "workers": frame.workers,
        "up": frame.up,
        "taken_at": frame.taken_at,
    }


def _s(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.{digits - 2}f}ms" if value < 1 else f"{value:.{digits}g}s"


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)


def frame_table(frame: Frame, top: int) -> Any:
    """A rich renderable of the busiest ``top`` buckets (0 = all)."""
    from rich.table import Table

    rows = busiest(frame, top)
    state = "" if frame.up else " — STORE UNREACHABLE (last known figures)"
    table = Table(
        title=f"interval buckets: {len(rows)} of {len(frame.rows)}, "
        f"{frame.workers} workers answering{state}",
        caption=f"rate and lateness over the last {frame.window_s:g} s",
    )
    for column in ("bucket", "starts/s", "interval", "held", "waiting", "late p50", "late p95",
                   "last late", "paused", "violations", "starts"):  # fmt: skip
        table.add_column(column, justify="left" if column == "bucket" else "right")
    for row in rows:
        table.add_row(
            row.bucket,
            f"{row.rate_per_s:.2f}",
            _s(row.interval_s),
            str(row.held),
            _n(row.waiting),
            _s(row.late_p50_s),
            _s(row.late_p95_s),
            _s(row.last_late_s),
            "?" if row.paused is None else ("yes" if row.paused else "no"),
            str(row.violations),
            str(row.starts),
        )
    return table
