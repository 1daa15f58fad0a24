"""One bucket's figures from its ledger, fed entry by entry: starts, grants, violations,
lateness (pure: no store, no clock)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass

from celery_interval.monitor.histogram import LATENESS_BOUNDS_S, Histogram
from celery_interval.starts import (
    CONTROL_OPS,
    Budget,
    is_grant,
    is_readmit,
    is_start,
    limits_of,
    replaces,
    start_time_us,
    units_of,
)

__all__ = ["RECENT_MAX", "BucketTally", "Violation"]

#: Starts remembered for the windowed rate and lateness quantiles, per bucket.
RECENT_MAX = 100_000


@dataclass(frozen=True)
class Violation:
    """A start that broke the interval in force at it (closer to the one before than the
    interval), or its bucket's burst budget."""

    task: str
    prev_task: str
    start_us: int
    gap_us: int
    interval_us: int


def _int(fields: Mapping[str, str], name: str) -> int | None:
    value = fields.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        return None


class BucketTally:
    """Counters of one bucket's ledger entries, fed in ledger order (the store's order of its
    scripts, which is the order of the starts they admit).

    The rules are the Spark audit's (``celery_interval.starts``): a start is a ``claim:OK``
    that is not a re-claim; a violation is a start whose admitted time is closer to the
    previous start's than the interval in force at it (the ``interval`` its entry records,
    else the one the latest control entry recorded), or, in a bucket with a burst, a start
    that overdraws the budget, or one that overdraws an extra limit's its entry names
    (``Budget``; counted by limit in ``limit_violations`` too). A moved readmit puts the start
    before it, which its holder missed, at its own time (``replaces``): no violation."""

    def __init__(self) -> None:
        self.starts = 0
        self.grants = 0
        self.readmits = 0
        self.violations = 0
        #: Starts that broke an extra limit, by the limit's (interval_us, burst).
        self.limit_violations: Counter[tuple[int, int]] = Counter()
        self.entries = 0
        self.ops: Counter[str] = Counter()
        self.lateness = Histogram(LATENESS_BOUNDS_S)
        self.last_start_us: int | None = None
        self.last_task = ""
        self.last_late_us: int | None = None
        self.interval_us: int | None = None
        self.last_violation: Violation | None = None
        self.recent: deque[tuple[int, int]] = deque(maxlen=RECENT_MAX)
        self._control_interval_us: int | None = None
        self._budget = Budget()
        self._last_start: Mapping[str, str] | None = None

    def feed(self, fields: Mapping[str, str]) -> None:
        """Count one ledger entry (its fields as text, as the stream holds them)."""
        op = fields.get("op", "")
        self.entries += 1
        self.ops[op] += 1
        recorded = _int(fields, "interval")
        if recorded is not None:
            self.interval_us = recorded  # the interval the store last acted on
            if op in CONTROL_OPS:
                self._control_interval_us = recorded
        if is_grant(fields):
            self.grants += 1
        if not is_start(fields):
            return
        self.starts += 1
        if is_readmit(fields):
            self.readmits += 1
        start = start_time_us(fields)
        interval = recorded if recorded is not None else self._control_interval_us
        task = fields.get("task", "")
        moved = replaces(fields, self._last_start)
        self._last_start = fields
        if moved:  # the start before, which its holder missed, is at this one's time instead
            if interval is not None:
                self._budget.moved(start, interval, units_of(fields)[1], limits_of(fields))
            if self.recent:
                self.recent.pop()
        elif interval is not None and self._budget.overdraws(
            start, interval, *units_of(fields), limits_of(fields)
        ):
            gap = 0 if self.last_start_us is None else start - self.last_start_us
            self.violations += 1
            self.limit_violations.update(self._budget.broken_limits)
            self.last_violation = Violation(task, self.last_task, start, gap, interval)
        late = _int(fields, "late")
        if late is not None:
            self.lateness.observe(late / 1e6)
            self.last_late_us = late
        self.recent.append((start, late if late is not None else -1))
        self.last_start_us = start
        self.last_task = task

    def window(self, now_us: int, window_us: int) -> list[tuple[int, int]]:
        """The ``(start_us, late_us)`` of the starts admitted in ``(now - window, now]``
        (``late_us`` -1 where the entry had none); older ones are forgotten."""
        since = now_us - window_us
        while self.recent and self.recent[0][0] <= since:
            self.recent.popleft()
        return [(s, late) for s, late in self.recent if s <= now_us]
