"""The ``celery_interval_*`` Prometheus metrics of a ``Frame``, served over HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from celery_interval.errors import ConfigurationError
from celery_interval.monitor.collector import Frame
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
    cumulative, _, total = histogram.snapshot()
    pairs = [("+Inf" if le == float("inf") else repr(le), float(n)) for le, n in cumulative]
    return pairs, total


def metric_families(frame: Frame) -> Iterator[Any]:
    """Every metric family of ``frame`` (counters since the exporter started)."""
    core = _prometheus().core
    counter, gauge = core.CounterMetricFamily, core.GaugeMetricFamily

    def per_bucket(family: Any, value: Any) -> Any:
        for row in frame.rows:
            v = value(row)
            if v is not None:
                family.add_metric([row.bucket, row.queue], float(v))
        return family

    yield per_bucket(
        counter(
            "celery_interval_starts", "Starts admitted (claim:OK, not a re-claim).", labels=LABELS
        ),
        lambda r: r.starts,
    )
    yield per_bucket(
        counter(
            "celery_interval_grants", "Tickets handed out (grant:OK, not a copy's).", labels=LABELS
        ),
        lambda r: r.grants,
    )
    yield per_bucket(
        counter(
            "celery_interval_claim_violations",
            "Starts that broke the interval in force, the burst's budget or an extra limit's.",
            labels=LABELS,
        ),
        lambda r: r.violations,
    )
    yield per_bucket(
        counter(
            "celery_interval_readmits",
            "Starts admitted anew because the task's admitted start passed unheard.",
            labels=LABELS,
        ),
        lambda r: r.readmits,
    )
    entries = counter(
        "celery_interval_ledger_entries", "Ledger entries read, by op.", labels=[*LABELS, "op"]
    )
    for row in frame.rows:
        for op, n in sorted(row.ops.items()):
            entries.add_metric([row.bucket, row.queue, op], float(n))
    yield entries
    yield per_bucket(
        counter(
            "celery_interval_ledger_gaps",
            "Times the ledger's cap trimmed entries the exporter had not read: counters are "
            "incomplete from then on.",
            labels=LABELS,
        ),
        lambda r: r.ledger_gaps,
    )
    yield per_bucket(
        counter(
            "celery_interval_ledger_lost_entries",
            "Ledger entries trimmed before the exporter read them (Redis >= 7 counts them).",
            labels=LABELS,
        ),
        lambda r: r.ledger_lost,
    )
    yield per_bucket(
        gauge("celery_interval_held", "Tasks the workers hold for their slot.", labels=LABELS),
        lambda r: r.held,
    )
    yield per_bucket(
        gauge(
            "celery_interval_waiting",
            "Tasks waiting in the broker: queue depth plus parked tasks.",
            labels=LABELS,
        ),
        lambda r: r.waiting,
    )
    yield per_bucket(
        gauge(
            "celery_interval_parked", "Tasks parked in the bucket's overflow queue.", labels=LABELS
        ),
        lambda r: r.parked,
    )
    yield per_bucket(
        gauge(
            "celery_interval_running",
            "Bodies holding a place of a capped bucket (its concurrency cap).",
            labels=LABELS,
        ),
        lambda r: r.running,
    )
    yield per_bucket(
        gauge("celery_interval_paused", "1 while the bucket is paused.", labels=LABELS),
        lambda r: None if r.paused is None else int(r.paused),
    )
    yield per_bucket(
        gauge(
            "celery_interval_interval_seconds", "The interval in force, in seconds.", labels=LABELS
        ),
        lambda r: r.interval_s,
    )
    yield per_bucket(
        gauge(
            "celery_interval_burst",
            "The bucket's burst: units that may start back to back (1: none).",
            labels=LABELS,
        ),
        lambda r: r.burst,
    )
    yield per_bucket(
        gauge(
            "celery_interval_budget_units",
            "Units of the interval's budget (its burst) a ticket could take now.",
            labels=LABELS,
        ),
        lambda r: r.units_left[0] if r.units_left else None,
    )
    yield per_bucket(
        gauge(
            "celery_interval_next_slot_seconds",
            "When the slot a ticket would get now comes (every limit's budget counted), in s.",
            labels=LABELS,
        ),
        lambda r: r.next_slot_in_s,
    )
    yield from _limit_families(frame, counter, gauge)
    lateness = core.HistogramMetricFamily(
        "celery_interval_start_lateness_seconds",
        "Admitted start minus the ticket's slot, in seconds.",
        labels=LABELS,
    )
    for row in frame.rows:
        if row.lateness is not None:
            buckets, total = _buckets(row.lateness)
            lateness.add_metric([row.bucket, row.queue], buckets, total)
    yield lateness
    calls = core.HistogramMetricFamily(
        "celery_interval_store_call_seconds",
        "Store call time of a grant or claim, from the workers' events.",
        labels=[*LABELS, "op"],
    )
    for (bucket, queue, op), histogram in sorted(frame.store_calls.items()):
        buckets, total = _buckets(histogram)
        calls.add_metric([bucket, queue, op], buckets, total)
    yield calls
    yield from _fleet_families(frame, counter, gauge)


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
