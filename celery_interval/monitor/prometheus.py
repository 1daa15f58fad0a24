"""The ``celery_interval_*`` Prometheus metrics of a ``Frame``, served over HTTP."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

from celery_interval.errors import ConfigurationError
from celery_interval.monitor.collector import BucketRow, Frame
from celery_interval.monitor.histogram import Histogram

__all__ = ["LABELS", "FrameMetrics", "metric_families", "serve"]

#: The labels of every per-bucket metric.
LABELS = ["bucket", "queue"]


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core  # the metric families
    except ImportError:
        raise ConfigurationError(
            "the exporter needs prometheus_client: pip install 'celery-interval[prometheus]'"
        ) from None
    return prometheus_client


def _buckets(histogram: Histogram) -> tuple[list[tuple[str, float]], float]:
    """``histogram``'s cumulative (upper bound, count) pairs as Prometheus has them, and sum."""
    cumulative, _, total = histogram.snapshot()
    pairs = [("+Inf" if le == float("inf") else repr(le), float(n)) for le, n in cumulative]
    return pairs, total


#: A per-bucket metric: its name, its help and what it reads of a row (None: no sample).
_Spec: TypeAlias = tuple[str, str, Callable[[BucketRow], float | None]]

#: The per-bucket counters of admissions, in the order served.
_ADMISSION_COUNTERS: tuple[_Spec, ...] = (
    ("celery_interval_starts", "Starts admitted (claim:OK, not a re-claim).", lambda r: r.starts),
    ("celery_interval_grants", "Tickets handed out (grant:OK, not a copy's).", lambda r: r.grants),
    (
        "celery_interval_claim_violations",
        "Starts that broke the interval in force, the burst's budget or an extra limit's.",
        lambda r: r.violations,
    ),
    (
        "celery_interval_readmits",
        "Starts admitted anew because the task's admitted start passed unheard.",
        lambda r: r.readmits,
    ),
)

#: The per-bucket counters of the ledger's losses, in the order served.
_LEDGER_LOSS_COUNTERS: tuple[_Spec, ...] = (
    (
        "celery_interval_ledger_gaps",
        "Times the ledger's cap trimmed entries the exporter had not read: counters are "
        "incomplete from then on.",
        lambda r: r.ledger_gaps,
    ),
    (
        "celery_interval_ledger_lost_entries",
        "Ledger entries trimmed before the exporter read them (Redis >= 7 counts them).",
        lambda r: r.ledger_lost,
    ),
)

#: The per-bucket gauges of state, in the order served.
_STATE_GAUGES: tuple[_Spec, ...] = (
    ("celery_interval_held", "Tasks the workers hold for their slot.", lambda r: r.held),
    (
        "celery_interval_waiting",
        "Tasks waiting in the broker: queue depth plus parked tasks.",
        lambda r: r.waiting,
    ),
    ("celery_interval_parked", "Tasks parked in the bucket's overflow queue.", lambda r: r.parked),
    (
        "celery_interval_running",
        "Bodies holding a place of a capped bucket (its concurrency cap).",
        lambda r: r.running,
    ),
    (
        "celery_interval_paused",
        "1 while the bucket is paused.",
        lambda r: None if r.paused is None else int(r.paused),
    ),
    (
        "celery_interval_interval_seconds",
        "The interval in force, in seconds.",
        lambda r: r.interval_s,
    ),
    (
        "celery_interval_burst",
        "The bucket's burst: units that may start back to back (1: none).",
        lambda r: r.burst,
    ),
    (
        "celery_interval_budget_units",
        "Units of the interval's budget (its burst) a ticket could take now.",
        lambda r: r.units_left[0] if r.units_left else None,
    ),
    (
        "celery_interval_next_slot_seconds",
        "When the slot a ticket would get now comes (every limit's budget counted), in s.",
        lambda r: r.next_slot_in_s,
    ),
    (
        "celery_interval_fair_weight",
        "A bucket nested in a fair outer bucket: its weight in the outer's share.",
        lambda r: r.fair_weight,
    ),
    (
        "celery_interval_fair_share",
        "A bucket nested in a fair outer bucket: its share of the outer's starts now "
        "(0: no work waiting).",
        lambda r: r.fair_share,
    ),
)


def metric_families(frame: Frame) -> Iterator[Any]:
    """Every metric family of ``frame`` (counters since the exporter started)."""
    core = _prometheus().core
    counter, gauge = core.CounterMetricFamily, core.GaugeMetricFamily
    yield from _per_bucket_families(frame, counter, _ADMISSION_COUNTERS)
    yield _ledger_entries(frame, counter)
    yield from _per_bucket_families(frame, counter, _LEDGER_LOSS_COUNTERS)
    yield from _per_bucket_families(frame, gauge, _STATE_GAUGES)
    yield from _limit_families(frame, counter, gauge)
    yield from _histogram_families(frame, core.HistogramMetricFamily)
    yield from _fleet_families(frame, counter, gauge)


def _per_bucket_families(frame: Frame, kind: Any, specs: tuple[_Spec, ...]) -> Iterator[Any]:
    """A family of type ``kind`` per (name, help, value) of ``specs``, labelled by bucket and
    queue, with a sample per row whose value is not None."""
    for name, documentation, value in specs:
        family = kind(name, documentation, labels=LABELS)
        for row in frame.rows:
            v = value(row)
            if v is not None:
                family.add_metric([row.bucket, row.queue], float(v))
        yield family


def _ledger_entries(frame: Frame, counter: Any) -> Any:
    """The ledger entries read, by bucket, queue and op."""
    entries = counter(
        "celery_interval_ledger_entries", "Ledger entries read, by op.", labels=[*LABELS, "op"]
    )
    for row in frame.rows:
        for op, n in sorted(row.ops.items()):
            entries.add_metric([row.bucket, row.queue, op], float(n))
    return entries


def _histogram_families(frame: Frame, histogram_family: Any) -> Iterator[Any]:
    """The start lateness per bucket, then the store call time per bucket and op."""
    lateness = histogram_family(
        "celery_interval_start_lateness_seconds",
        "Admitted start minus the ticket's slot, in seconds.",
        labels=LABELS,
    )
    for row in frame.rows:
        if row.lateness is not None:
            _add_histogram(lateness, [row.bucket, row.queue], row.lateness)
    yield lateness
    calls = histogram_family(
        "celery_interval_store_call_seconds",
        "Store call time of a grant or claim, from the workers' events.",
        labels=[*LABELS, "op"],
    )
    for (bucket, queue, op), histogram in sorted(frame.store_calls.items()):
        _add_histogram(calls, [bucket, queue, op], histogram)
    yield calls


def _add_histogram(family: Any, labels: list[str], histogram: Histogram) -> None:
    """Add ``histogram``'s cumulative buckets and sum to ``family`` as the sample ``labels``."""
    buckets, total = _buckets(histogram)
    family.add_metric(labels, buckets, total)


def _limit_families(frame: Frame, counter: Any, gauge: Any) -> Iterator[Any]:
    """The extra limits' gauges and violations, labelled by each limit's name (``'100/min'``,
    ``'1000/h burst 50'``: ``limits_config.describe_limit``)."""
    labels = [*LABELS, "limit"]
    intervals = gauge(
        "celery_interval_limit_interval_seconds",
        "An extra limit's interval (a declaration's limits), in seconds.",
        labels=labels,
    )
    bursts = gauge("celery_interval_limit_burst", "An extra limit's burst (units).", labels=labels)
    broken = counter(
        "celery_interval_limit_violations",
        "Starts that broke an extra limit's budget, label limit (a start may break several).",
        labels=labels,
    )
    left = gauge(
        "celery_interval_limit_budget_units",
        "Units of an extra limit's budget a ticket could take now.",
        labels=labels,
    )
    for row in frame.rows:
        for i, (name, interval_s, burst) in enumerate(row.limits):
            at = [row.bucket, row.queue, name]
            intervals.add_metric(at, interval_s)
            bursts.add_metric(at, float(burst))
            if i + 1 < len(row.units_left):
                left.add_metric(at, float(row.units_left[i + 1]))
        for name, n in sorted(row.limit_violations.items()):
            broken.add_metric([row.bucket, row.queue, name], float(n))
    yield intervals
    yield bursts
    yield left
    yield broken


def _fleet_families(frame: Frame, counter: Any, gauge: Any) -> Iterator[Any]:
    """The exporter's own gauges and counters: the store, the workers, the refreshes, events."""
    yield gauge("celery_interval_up", "1 if the last refresh read the store.", value=int(frame.up))
    yield gauge(
        "celery_interval_workers", "Workers that answered the last inspect.", value=frame.workers
    )
    yield counter(
        "celery_interval_refresh_errors",
        "Refreshes that failed to read the store.",
        value=frame.errors,
    )
    yield gauge(
        "celery_interval_refresh_seconds", "How long the last refresh took.", value=frame.refresh_s
    )
    yield gauge(
        "celery_interval_unconfigured_buckets",
        "Buckets with state in the store that no configured queue names.",
        value=frame.unconfigured,
    )
    yield counter(
        "celery_interval_events", "Store call events received.", value=frame.events_received
    )


class FrameMetrics:
    """A Prometheus collector serving the latest frame handed to ``update``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._frame: Frame | None = None

    def update(self, frame: Frame) -> None:
        with self._lock:
            self._frame = frame

    def collect(self) -> Iterator[Any]:
        with self._lock:
            frame = self._frame
        if frame is not None:
            yield from metric_families(frame)


def serve(metrics: FrameMetrics, port: int, addr: str) -> Any:
    """Serve ``metrics`` (alone: no process or platform metrics) on ``addr:port``; the server."""
    prometheus_client = _prometheus()
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    try:
        server, _thread = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise ConfigurationError(f"--addr={addr!r} --port={port!r}: cannot listen: {exc}") from None
    return server
