"""One PNG of a comparison: a start-time raster and the gap distribution of each system."""

from __future__ import annotations

import itertools
from pathlib import Path

from harness import Measured

RASTER_INTERVALS = 30  # raster window width, in target intervals


def plot_compare(runs: list[Measured], path: Path) -> None:
    """Rows: one per interval. Left: starts in a mid-run window. Right: CDF of gap/interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    intervals = sorted({r.figures.interval_s for r in runs})
    systems = list(dict.fromkeys(r.system for r in runs))
    colors = {s: f"C{n}" for n, s in enumerate(systems)}
    fig, axes = plt.subplots(
        len(intervals), 2, figsize=(11, 3.3 * len(intervals)), squeeze=False,
        gridspec_kw={"width_ratios": [1.4, 1]},
    )  # fmt: skip
    for row, interval_s in enumerate(intervals):
        raster, cdf = axes[row]
        these = [r for r in runs if r.figures.interval_s == interval_s]
        for y, run in enumerate(these):
            starts = run.start_times_s()
            if len(starts) < 2:
                continue
            t0 = starts[len(starts) // 2]
            window = [
                (t - t0) / interval_s for t in starts if 0 <= t - t0 < RASTER_INTERVALS * interval_s
            ]
            raster.eventplot(
                [window], lineoffsets=y, linelengths=0.7, colors=colors[run.system], linewidths=1.2
            )
            gaps = sorted((b - a) / interval_s for a, b in itertools.pairwise(starts))
            cdf.step(
                [min(g, 3.0) for g in gaps],
                [(n + 1) / len(gaps) for n in range(len(gaps))],
                where="post",
                color=colors[run.system],
                label=run.system,
            )
        raster.set_yticks(range(len(these)), [r.system for r in these], fontsize=8)
        raster.invert_yaxis()
        raster.set_xlim(0, RASTER_INTERVALS)
        raster.set_xticks(range(0, RASTER_INTERVALS + 1, 5))
        raster.grid(axis="x", alpha=0.3)
        raster.set_xlabel("body starts, in target intervals (mid-run window)")
        raster.set_title(f"interval {interval_s * 1e3:g} ms: starts", fontsize=10)
        cdf.axvline(0.9, color="red", linestyle="--", linewidth=0.8)
        cdf.set_xlim(0, 3)
        cdf.set_ylim(0, 1.01)
        cdf.set_xlabel("gap between consecutive starts / interval (clipped at 3)")
        cdf.set_ylabel("share of gaps <= x")
        cdf.set_title("left of the red line: violations (< 0.9 x interval)", fontsize=10)
        cdf.grid(alpha=0.3)
        if row == 0:
            cdf.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
