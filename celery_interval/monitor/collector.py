"""The figures of every bucket at one moment (a ``Frame``), from the ledgers, the store, the
workers and the broker: what the exporter serves and ``interval top`` shows."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from redis.exceptions import RedisError

from celery_interval import control
from celery_interval.app_store import store_of
from celery_interval.buckets import overflow_queue_name, queue_of
from celery_interval.config import settings_of
from celery_interval.config.values import describe_limit
from celery_interval.demo.report import percentile
from celery_interval.errors import ConfigurationError, StoreUnavailable
from celery_interval.ledger import LedgerReader, reader_for_app
from celery_interval.monitor.events import StoreCallEvents
from celery_interval.monitor.fleet import held_per_worker, queue_depths
from celery_interval.monitor.histogram import Histogram
from celery_interval.monitor.tail import LedgerTail
from celery_interval.schedule import Limit, Pace, Status
from celery_interval.shares import KeyShare, fair_shares

__all__ = ["BucketRow", "Collector", "Frame"]

logger = logging.getLogger(__name__)


@dataclass
class BucketRow:
    """One bucket's figures: ledger counters since the exporter began, and gauges now."""

    bucket: str
    queue: str
    starts: int = 0
    grants: int = 0
    readmits: int = 0
    violations: int = 0
    #: Starts that broke an extra limit, by the limit's name (``'100/min'``).
    limit_violations: dict[str, int] = field(default_factory=dict)
    ops: dict[str, int] = field(default_factory=dict)
    lateness: Histogram | None = None
    rate_per_s: float = 0.0
    late_p50_s: float | None = None
    late_p95_s: float | None = None
    last_late_s: float | None = None
    interval_s: float | None = None
    #: The bucket's configured burst (units; 1: none).
    burst: int = 1
    #: The bucket's extra limits: (name, interval in seconds, burst) each (its ``limits``;
    #: the name as ``limits_config.describe_limit`` gives it, ``'1000/h burst 50'``).
    limits: tuple[tuple[str, float, int], ...] = ()
    #: The grants' budgets left, in units: the interval's burst, then each extra limit's
    #: (() while the bucket's status is not read).
    units_left: tuple[int, ...] = ()
    #: When the slot a ticket would get now comes, in seconds (None: status not read).
    next_slot_in_s: float | None = None
    paused: bool | None = None
    overridden: bool | None = None
    #: Bodies holding a live place of a capped bucket (None: its status was not read).
    running: int | None = None
    held: int = 0
    depth: int | None = None
    parked: int | None = None
    ledger_gaps: int = 0
    ledger_lost: int = 0
    #: Nested in a fair outer: its weight and its share of the outer's starts now (0: no
    #: work waiting); None: not in a fair share, or its share was not read.
    fair_weight: int | None = None
    fair_share: float | None = None

    @property
    def waiting(self) -> int | None:
        """Tasks waiting in the broker: the queue's depth plus the parked ones (None: the
        broker answered neither)."""
        if self.depth is None and self.parked is None:
            return None
        return (self.depth or 0) + (self.parked or 0)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view (no histograms)."""
        return {
            "bucket": self.bucket,
            "queue": self.queue,
            "rate_per_s": self.rate_per_s,
            "starts": self.starts,
            "grants": self.grants,
            "readmits": self.readmits,
            "violations": self.violations,
            "limit_violations": dict(self.limit_violations),
            "interval_s": self.interval_s,
            "burst": self.burst,
            "limits": [list(limit) for limit in self.limits],
            "units_left": list(self.units_left),
            "next_slot_in_s": self.next_slot_in_s,
            "paused": self.paused,
            "running": self.running,
            "held": self.held,
            "depth": self.depth,
            "parked": self.parked,
            "waiting": self.waiting,
            "late_p50_s": self.late_p50_s,
            "late_p95_s": self.late_p95_s,
            "last_late_s": self.last_late_s,
            "ledger_gaps": self.ledger_gaps,
            "ledger_lost": self.ledger_lost,
            "fair_weight": self.fair_weight,
            "fair_share": self.fair_share,
        }


@dataclass
class Frame:
    """Every bucket's row at one refresh, and the state of the sources."""

    rows: list[BucketRow]
    window_s: float
    workers: int
    up: bool
    errors: int
    unconfigured: int
    refresh_s: float
    taken_at: float
    store_calls: dict[tuple[str, str, str], Histogram] = field(default_factory=dict)
    events_received: int = 0


class Collector:
    """Brings the figures of the buckets whose names match ``match`` up to date on each
    ``refresh``; looks for new buckets every ``rescan_s``. With ``events``, consumes the
    workers' store call events on a thread (``start``/``stop``)."""

    def __init__(
        self,
        app: Any,
        *,
        match: str = "*",
        window_s: float = 10.0,
        rescan_s: float = 5.0,
        inspect_timeout_s: float = 1.0,
        events: bool = False,
        reader: LedgerReader | None = None,
    ) -> None:
        if not window_s > 0:
            raise ConfigurationError(f"window={window_s!r}: expected seconds > 0")
        self.app = app
        self.match = match
        self.window_s = window_s
        self.rescan_s = rescan_s
        self.inspect_timeout_s = inspect_timeout_s
        self.reader = reader if reader is not None else reader_for_app(app)
        self.tail = LedgerTail(self.reader)
        self.events = StoreCallEvents(app, match) if events else None
        self.errors = 0
        self._known: list[tuple[str, Pace]] = []
        self._unconfigured = 0
        self._scanned_at: float | None = None
        self._statuses: dict[str, Status] = {}
        self._shares: dict[str, KeyShare] = {}
        self._workers = 0
        self._rescanned = False
        self._now_us = 0
        self._down = False
        self._configured = set(settings_of(app).buckets())

    def start(self) -> None:
        """Start consuming store call events (when asked for)."""
        if self.events is not None:
            self.events.start()

    def stop(self) -> None:
        if self.events is not None:
            self.events.stop()
        self.reader.close()

    def refresh(self) -> Frame:
        """Read what changed since the last refresh; the store's failure gives a frame of the
        last known figures with ``up`` false (logged once per outage)."""
        began = time.monotonic()
        up = True
        try:
            self._read_store(began)
            if self._down:
                logger.warning("interval exporter: store reachable again")
                self._down = False
        except (StoreUnavailable, RedisError) as exc:
            up = False
            self.errors += 1
            if not self._down:
                logger.warning("interval exporter: store unavailable (%s); retrying", exc)
                self._down = True
        rows = self._rows(up)
        return Frame(
            rows=rows,
            window_s=self.window_s,
            workers=self._workers,
            up=up,
            errors=self.errors,
            unconfigured=self._unconfigured,
            refresh_s=time.monotonic() - began,
            taken_at=time.time(),
            store_calls=self.events.snapshot() if self.events is not None else {},
            events_received=self.events.received if self.events is not None else 0,
        )

    def _read_store(self, now: float) -> None:
        if self._scanned_at is None or now - self._scanned_at >= self.rescan_s:
            found, unknown = control.statuses(self.app, self.match)
            self._unconfigured = len(unknown)
            self._known = [(b, control.configured_pace(self.app, b)) for b, _ in found]
            self._statuses = dict(found)
            ledgers = [b for b in self.reader.buckets() if fnmatchcase(b, self.match)]
            self.tail.follow(sorted({*ledgers, *self._statuses}))
            self._scanned_at = now
            self._rescanned = True
        else:
            self._statuses = dict(control.read_paced(self.app, self._known))
        self._shares = fair_shares(settings_of(self.app), store_of(self.app), self._statuses)
        self.tail.poll()
        self._now_us = self.reader.now_us()

    def _rows(self, up: bool) -> list[BucketRow]:
        names = sorted(self.tail.tallies)
        rows = {name: self._row(name, up) for name in names}
        if not names:
            return list(rows.values())
        # Every worker is asked when the buckets are rescanned; in between, the answers stop
        # being waited for once as many workers as then answered.
        full, self._rescanned = self._rescanned, False
        limit = None if full or not self._workers else self._workers
        per_worker, _ = held_per_worker(self.app, self.inspect_timeout_s, names, limit)
        if full or len(per_worker) > self._workers:
            self._workers = len(per_worker)
        configured = [n for n in names if n in self._configured]
        overflows = {n: overflow_queue_name(queue_of(n), n) for n in names}
        depths = queue_depths(self.app, configured + list(overflows.values()))
        for name, row in rows.items():
            row.held = sum(
                int(stats.get(name, {}).get("held", 0) or 0)
                for stats in per_worker.values()
                if isinstance(stats, dict)
            )
            row.depth = depths.get(name)
            row.parked = depths.get(overflows[name])
        return list(rows.values())

    def _row(self, name: str, up: bool) -> BucketRow:
        tally = self.tail.tallies[name]
        cursor = self.tail.cursors[name]
        row = BucketRow(
            bucket=name,
            queue=queue_of(name),
            starts=tally.starts,
            grants=tally.grants,
            readmits=tally.readmits,
            violations=tally.violations,
            limit_violations={
                describe_limit(Limit(interval_us, burst)): n
                for (interval_us, burst), n in sorted(tally.limit_violations.items())
            },
            ops=dict(tally.ops),
            lateness=tally.lateness,
            last_late_s=None if tally.last_late_us is None else tally.last_late_us / 1e6,
            ledger_gaps=cursor.gaps,
            ledger_lost=cursor.lost,
        )
        if up:
            recent = tally.window(self._now_us, round(self.window_s * 1e6))
            row.rate_per_s = len(recent) / self.window_s
            lates = [late / 1e6 for _, late in recent if late >= 0]
            if lates:
                row.late_p50_s = percentile(lates, 50)
                row.late_p95_s = percentile(lates, 95)
        # The interval in force: an override, else the one the store last acted on (its
        # ledger's latest entry: a task's own ``interval`` included), else the configured one.
        status = self._statuses.get(name)
        interval_us = tally.interval_us
        if status is not None:
            row.paused = status.paused
            row.overridden = status.overridden
            row.running = status.running
            row.units_left = status.units_left
            row.next_slot_in_s = status.next_slot_in_us / 1e6
            if status.overridden or interval_us is None:
                interval_us = status.interval_us
        if interval_us is not None:
            row.interval_s = interval_us / 1e6
        share = self._shares.get(name)
        if share is not None:
            row.fair_weight, row.fair_share = share.weight, share.share
        row.burst = settings_of(self.app).burst_of(name)
        limits = settings_of(self.app).limits_of(name)
        row.limits = tuple(
            (describe_limit(limit), limit.interval_us / 1e6, limit.burst) for limit in limits
        )
        return row
