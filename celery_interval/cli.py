"""Command lines: ``celery -A proj interval …`` and the ``celery-interval`` program."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from celery_interval import control
from celery_interval.config import settings_of
from celery_interval.errors import IntervalError

__all__ = ["interval", "main"]


def _app(ctx: click.Context) -> Any:
    obj = ctx.find_root().obj
    app = getattr(obj, "app", None)
    if app is None:
        raise click.UsageError("no app: run it as `celery -A proj interval …`")
    return app


def _fail_on_interval_errors(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except IntervalError as exc:
            raise click.ClickException(str(exc)) from exc

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def _queue_depth(app: Any, queue: str) -> int | None:
    try:
        with app.connection_for_read() as conn:
            return int(conn.default_channel.queue_declare(queue, passive=True).message_count)
    except Exception:
        return None


def _held_per_worker(app: Any, timeout_s: float) -> dict[str, dict[str, Any]]:
    try:
        return app.control.inspect(timeout=timeout_s).interval_stats() or {}
    except Exception:
        return {}


@click.group(name="interval")
def interval() -> None:
    """Inspect and control interval queues (works with no worker running)."""


@interval.command()
@click.argument("queue", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--timeout", "timeout_s", default=1.0, show_default=True, help="Inspect timeout.")
@click.pass_context
@_fail_on_interval_errors
def status(ctx: click.Context, queue: str | None, as_json: bool, timeout_s: float) -> None:
    """Interval, paused, tickets, next slot, held per worker and broker depth of each queue."""
    app = _app(ctx)
    buckets = [queue] if queue else settings_of(app).buckets()
    per_worker = _held_per_worker(app, timeout_s)
    rows = []
    for bucket in buckets:
        row = control.status_dict(control.status(app, bucket))
        row["queue"] = bucket
        row["held"] = {
            worker: stats.get(bucket, {}).get("held", 0) for worker, stats in per_worker.items()
        }
        row["broker_depth"] = _queue_depth(app, bucket)
        rows.append(row)
    if as_json:
        click.echo(json.dumps({"queues": rows}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="interval queues")
    for col in ("queue", "interval s", "paused", "tickets", "next slot in s", "held", "depth"):
        table.add_column(col)
    for row in rows:
        held = ", ".join(f"{w}={n}" for w, n in sorted(row["held"].items())) or "-"
        table.add_row(
            row["queue"],
            f"{row['interval_s']:g}" + (" (set)" if row["overridden"] else ""),
            "yes" if row["paused"] else "no",
            str(row["tickets"]),
            f"{row['next_slot_in_s']:.3f}",
            held,
            "?" if row["broker_depth"] is None else str(row["broker_depth"]),
        )
    Console().print(table)


@interval.command()
@click.argument("queue")
@click.pass_context
@_fail_on_interval_errors
def pause(ctx: click.Context, queue: str) -> None:
    """Pause QUEUE for the whole pool (kept in the store)."""
    control.pause(_app(ctx), queue)
    click.echo(f"paused {queue}")


@interval.command()
@click.argument("queue")
@click.pass_context
@_fail_on_interval_errors
def unpause(ctx: click.Context, queue: str) -> None:
    """Resume QUEUE; held tasks keep their order and spacing."""
    control.unpause(_app(ctx), queue)
    click.echo(f"unpaused {queue}")


@interval.command(name="set")
@click.argument("queue")
@click.argument("interval_value", metavar="INTERVAL")
@click.pass_context
@_fail_on_interval_errors
def set_(ctx: click.Context, queue: str, interval_value: str) -> None:
    """Set QUEUE's interval: seconds (0.5) or a rate (10/s, 30/m, 100/h)."""
    result = control.set_interval(_app(ctx), queue, interval_value)
    click.echo(f"{queue}: interval {result.interval_us / 1e6:g}s")


@interval.command()
@click.argument("queue")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@_fail_on_interval_errors
def reset(ctx: click.Context, queue: str, yes: bool) -> None:
    """Forget QUEUE's state (pause, override, tickets): a new epoch starts."""
    if not yes:
        click.confirm(f"reset {queue}? held tasks will be re-ticketed", abort=True)
    control.reset(_app(ctx), queue)
    click.echo(f"reset {queue}")


@click.group()
def main() -> None:
    """celery-interval: one global start interval per Celery queue."""


@main.command()
@click.option("--workers", default=3, show_default=True, help="Real `celery worker` processes.")
@click.option("--tasks", default=60, show_default=True, help="Tasks to enqueue.")
@click.option("--interval", "interval_s", default=0.05, show_default=True, help="Seconds.")
@click.option("--pause", "pause_s", default=2.0, show_default=True, help="Pause length (s).")
@click.option("--broker", default=None, help="Broker URL (default: an embedded redis-server).")
@click.option("--store", default=None, help="Store URL (default: the embedded redis-server).")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def demo(
    workers: int,
    tasks: int,
    interval_s: float,
    pause_s: float,
    broker: str | None,
    store: str | None,
    as_json: bool,
) -> None:
    """Run a real pool on one interval queue, pause it mid-run, and check every start."""
    from celery_interval.demo import DemoOptions, run_demo
    from celery_interval.intervals import parse_interval_us

    parse_interval_us(interval_s, name="--interval")
    if workers < 1 or tasks < 2:
        raise click.BadParameter("--workers must be >= 1 and --tasks >= 2")
    code, _ = run_demo(
        DemoOptions(
            workers=workers,
            tasks=tasks,
            interval_s=interval_s,
            pause_s=pause_s,
            broker=broker,
            store=store,
            as_json=as_json,
        )
    )
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover - `python -m celery_interval.cli`
    main()
