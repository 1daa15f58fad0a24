"""``celery -A proj interval top``: the busiest buckets, refreshed every second."""

from __future__ import annotations

import json
import sys
import time

import click

from celery_interval.cli.common import (
    app_of,
    fail_on_interval_errors,
    match_option,
    seconds_option,
)

__all__ = ["top"]


@click.command()
@match_option
@click.option(
    "--top",
    "top_n",
    default=20,
    show_default=True,
    type=click.IntRange(min=0),
    help="Show this many buckets, busiest first (0 = all).",
)
@seconds_option("--window", "window_s", 10.0, "Seconds of starts the rate and lateness cover.")
@seconds_option("--refresh", "refresh_s", 1.0, "Seconds between frames.")
@seconds_option(
    "--timeout", "timeout_s", 0.5, "Seconds to wait for the workers' answers to inspect."
)
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--json", "as_json", is_flag=True, help="Print one frame as JSON and exit.")
@click.pass_context
@fail_on_interval_errors
def top(
    ctx: click.Context,
    match: str,
    top_n: int,
    window_s: float,
    refresh_s: float,
    timeout_s: float,
    once: bool,
    as_json: bool,
) -> None:
    """Each bucket's start rate, interval, held and waiting tasks, lateness and pause state,
    live (the exporter's figures)."""
    from rich.console import Console
    from rich.live import Live

    from celery_interval.monitor.collector import Collector
    from celery_interval.monitor.view import frame_json, frame_table

    collector = Collector(
        app_of(ctx),
        match=match,
        window_s=window_s,
        rescan_s=max(5.0, refresh_s),
        inspect_timeout_s=min(timeout_s, refresh_s),
    )
    try:
        if as_json:
            click.echo(json.dumps(frame_json(collector.refresh(), top_n)))
            return
        console = Console(width=None if sys.stdout.isatty() else 200)
        if once:
            console.print(frame_table(collector.refresh(), top_n))
            return
        with Live(frame_table(collector.refresh(), top_n), console=console) as live:
            while True:
                began = time.monotonic()
                live.update(frame_table(collector.refresh(), top_n))
                time.sleep(max(0.0, refresh_s - (time.monotonic() - began)))
    except KeyboardInterrupt:
        pass
    finally:
        collector.stop()
