"""A fixed-bound histogram of seconds, kept as Prometheus keeps one (cumulative on export)."""

from __future__ import annotations

import bisect
import threading

__all__ = ["LATENESS_BOUNDS_S", "STORE_CALL_BOUNDS_S", "Histogram"]

#: Upper bounds of the lateness histogram (start - slot), in seconds.
LATENESS_BOUNDS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip
#: Upper bounds of the store call histogram (one grant or claim round trip), in seconds.
STORE_CALL_BOUNDS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


class Histogram:
    """Counts of observations per bin (``value <= bound``, the last bin unbounded) and their
    sum; safe to observe from one thread while another reads it."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"bounds={bounds!r}: expected increasing, distinct values")
        self.bounds = bounds
        self._bins = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bin whose bound is at least ``value``."""
        with self._lock:
            self._bins[bisect.bisect_left(self.bounds, value)] += 1
            self._sum += value

    def snapshot(self) -> tuple[list[tuple[float, int]], int, float]:
        """``[(le, cumulative count), …, (inf, count)]``, the count and the sum."""
        with self._lock:
            bins, total = list(self._bins), self._sum
        cumulative: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), bins):
            running += n
            cumulative.append((bound, running))
        return cumulative, running, total

    @property
    def count(self) -> int:
        with self._lock:
            return sum(self._bins)
