"""``celery -A proj interval exporter``: the fleet's interval figures as Prometheus metrics."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import click

from celery_interval.cli.common import (
    app_of,
    fail_on_interval_errors,
    match_option,
    seconds_option,
)
from celery_interval.config import settings_of

__all__ = ["exporter"]


@click.command()
@click.option("--port", default=9808, show_default=True, type=click.IntRange(1, 65535))
@click.option("--addr", default="0.0.0.0", show_default=True, help="Address to listen on.")
@seconds_option("--interval", "interval_s", 5.0, "Seconds between refreshes of the figures.")
@match_option
@seconds_option(
    "--timeout", "timeout_s", 1.0, "Seconds to wait for the workers' answers to inspect."
)
@click.pass_context
@fail_on_interval_errors
def exporter(
    ctx: click.Context,
    port: int,
    addr: str,
    interval_s: float,
    match: str,
    timeout_s: float,
) -> None:
    """Serve every bucket's starts, grants, violations, held and waiting tasks, pause state,
    interval, lateness and store call times at http://ADDR:PORT/metrics (one process for the
    whole fleet)."""
    from celery_interval.monitor.collector import Collector
    from celery_interval.monitor.loop import run
    from celery_interval.monitor.prometheus import FrameMetrics, serve

    app = app_of(ctx)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    collector = Collector(
        app,
        match=match,
        rescan_s=max(5.0, interval_s),
        inspect_timeout_s=min(timeout_s, interval_s),
        events=True,
    )
    metrics = FrameMetrics()
    try:
        server = serve(metrics, port, addr)
    except BaseException:
        collector.stop()
        raise
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ledger = "off (interval_ledger_max=0)" if settings_of(app).ledger_max == 0 else "on"
    click.echo(
        f"interval exporter: http://{addr}:{port}/metrics, refresh {interval_s:g}s, "
        f"buckets {match!r}, ledger {ledger}",
        err=True,
    )
    collector.start()
    try:
        run(collector, metrics, interval_s, stop)
    finally:
        server.shutdown()
        collector.stop()
