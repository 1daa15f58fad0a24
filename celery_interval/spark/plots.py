"""The audit's PNG plots (matplotlib's Agg renderer, no pyplot state): gaps, lateness, workers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

__all__ = ["gap_histogram", "lateness", "worker_share"]

_DPI = 100
_BAD = "#c0392b"
_GOOD = "#2e86c1"


def _bucket_axes() -> tuple[Figure, Axes]:
    """A figure of a per-bucket plot, with fixed margins: a tight layout would draw it twice,
    and there are two of these per bucket."""
    fig = Figure(figsize=(7, 3.6))
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.14, top=0.92)
    return fig, fig.add_subplot()


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=_DPI, format="png")


def gap_histogram(
    path: Path, bucket: str, bins: Sequence[tuple[float, float, int]], interval_s: float | None
) -> None:
    """Gaps between starts (``(lo_s, hi_s, count)`` bins) with the interval marked; bins
    below the interval in red."""
    fig, ax = _bucket_axes()
    below = [interval_s is not None and lo_s < interval_s * (1 - 1e-9) for lo_s, _, _ in bins]
    ax.bar([lo_s * 1e3 for lo_s, _, _ in bins], [count for _, _, count in bins],
           width=[(hi_s - lo_s) * 1e3 for lo_s, hi_s, _ in bins], align="edge",
           color=[_BAD if bad else _GOOD for bad in below], edgecolor="white",
           linewidth=0.3)  # fmt: skip
    if interval_s is not None:
        ax.axvline(interval_s * 1e3, color="black", linestyle="--", linewidth=1)
        ax.annotate(f"interval {interval_s * 1e3:g} ms", (interval_s * 1e3, 1),
                    xycoords=("data", "axes fraction"), xytext=(4, -14),
                    textcoords="offset points", fontsize=8)  # fmt: skip
    ax.set_xlim(left=0)
    ax.set_xlabel("gap between starts (ms; the last bin holds every longer gap)")
    ax.set_ylabel("gaps")
    ax.set_title(f"{bucket}: gaps between starts", fontsize=10)
    _save(fig, path)


def lateness(
    path: Path,
    bucket: str,
    points: Sequence[tuple[float, float, float]],
    pauses: Sequence[tuple[float, float]],
) -> None:
    """Lateness (start - slot) over time: ``(t_s, mean_s, max_s)`` per time bin, with the
    pause windows ``(from_s, to_s)`` shaded."""
    fig, ax = _bucket_axes()
    for n, (from_s, to_s) in enumerate(pauses):
        ax.axvspan(from_s, to_s, color="#f5b041", alpha=0.3, label="paused" if n == 0 else None)
    t = [p[0] for p in points]
    marker = "." if len(points) < 100 else None
    ax.plot(t, [p[2] * 1e3 for p in points], color=_BAD, linewidth=0.8, marker=marker,
            label="max")  # fmt: skip
    ax.plot(t, [p[1] * 1e3 for p in points], color=_GOOD, linewidth=1.2, marker=marker,
            label="mean")  # fmt: skip
    ax.set_xlabel("time since the first start (s, store clock)")
    ax.set_ylabel("lateness: start - slot (ms)")
    ax.set_title(f"{bucket}: lateness over time", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper right")
    _save(fig, path)


def worker_share(path: Path, buckets: Sequence[tuple[str, Sequence[tuple[str, float]]]]) -> None:
    """Each bucket's starts split by worker: one stacked horizontal bar per bucket."""
    fig = Figure(figsize=(7, 1.2 + 0.45 * len(buckets)), layout="tight")
    ax = fig.add_subplot()
    workers = sorted({w for _, shares in buckets for w, _ in shares})
    colors = {w: f"C{n % 10}" for n, w in enumerate(workers)}
    for y, (_bucket, shares) in enumerate(buckets):
        left = 0.0
        for worker, share in shares:
            ax.barh(y, share, left=left, color=colors[worker], edgecolor="white", linewidth=0.5)
            if share >= 0.08:
                ax.text(left + share / 2, y, f"{share:.0%}", ha="center", va="center", fontsize=7)
            left += share
    ax.set_yticks(range(len(buckets)), [b for b, _ in buckets], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of starts")
    ax.set_title("starts per worker", fontsize=10)
    handles = [ax.bar(0, 0, color=colors[w], label=w) for w in workers[:12]]
    if handles:
        ax.legend(fontsize=7, loc="lower right", ncol=max(1, len(handles) // 6))
    _save(fig, path)
