"""``celery -A proj interval status``: each bucket's state, held tasks, depth and parked tasks."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from celery_interval import control
from celery_interval.buckets import overflow_queue_name, queue_of
from celery_interval.cli.common import app_of, fail_on_interval_errors
from celery_interval.config import Settings, settings_of
from celery_interval.config.intervals import describe_rate
from celery_interval.config.values import describe_limits, limit_dict
from celery_interval.errors import UnknownBucket
from celery_interval.monitor.fleet import held_per_worker, queue_depths

__all__ = ["status"]


#: ``--sort`` keys: the most backed-up (latest next slot) or most ticketed first, or by name.
_SORTS: dict[str, Any] = {
    "next": lambda row: (-row["next_slot_in_s"], row["queue"]),
    "ticket": lambda row: (-row["tickets"], row["queue"]),
    "name": lambda row: row["queue"],
}


def _budget_text(row: dict[str, Any]) -> str:
    """The units left of each budget: ``'2/3'`` (the interval's burst), then each extra
    limit's, ``'2/3, 100/min 0/1'``."""
    if "budget_left" not in row:
        return "?"
    parts = [f"{row['budget_left']}/{row['burst']}"]
    parts += [f"{x['limit']} {x['budget_left']}/{x['burst']}" for x in row["limits"]]
    return ", ".join(parts)


def declaration_of(settings: Settings, bucket: str) -> dict[str, Any]:
    """What is declared for ``bucket`` (its own entry, its ``'queue:*'`` one, its queue's),
    each field only when set: interval (as a rate), burst, limits, concurrency, adaptive (the
    slowest rate), outer and interactive share."""
    try:
        interval_us = settings.interval_us(bucket)
    except UnknownBucket:
        return {}
    found: dict[str, Any] = {"interval": describe_rate(interval_us)}
    if settings.burst_of(bucket) > 1:
        found["burst"] = settings.burst_of(bucket)
    if settings.limits_of(bucket):
        found["limits"] = describe_limits(settings.limits_of(bucket))
    if settings.concurrency_of(bucket) is not None:
        found["concurrency"] = settings.concurrency_of(bucket)
    slowest_us = settings.adapt_max_us(bucket, interval_us)
    if slowest_us is not None:
        found["adaptive"] = f"down to {describe_rate(slowest_us)}"
    if settings.outer_name(bucket) is not None:
        found["outer"] = settings.outer_name(bucket)
    if settings.share_of(bucket) is not None:
        found["interactive_share"] = settings.share_of(bucket)
    return found


def _declaration_text(found: dict[str, Any]) -> str:
    """A declaration in one cell, a line per field: ``10/s``, ``burst 3``, ``outer api``."""
    parts = [str(found.get("interval", "-"))]
    parts += [
        f"{name.replace('_', ' ')} {value}" for name, value in found.items() if name != "interval"
    ]
    return "\n".join(parts)


@click.command()
@click.argument("queue", required=False)
@click.option(
    "--match",
    default="*",
    show_default=True,
    metavar="GLOB",
    help="Only buckets whose names match, e.g. 'api:shop-*'.",
)
@click.option(
    "--top",
    default=20,
    show_default=True,
    type=click.IntRange(min=0),
    help="Show this many buckets (0 = all).",
)
@click.option(
    "--sort",
    "sort_by",
    default="next",
    show_default=True,
    type=click.Choice(sorted(_SORTS)),
    help="next: latest next slot (most backed up) first; ticket: most tickets first; name.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--timeout", "timeout_s", default=1.0, show_default=True, help="Inspect timeout.")
@click.pass_context
@fail_on_interval_errors
def status(
    ctx: click.Context,
    queue: str | None,
    match: str,
    top: int,
    sort_by: str,
    as_json: bool,
    timeout_s: float,
) -> None:
    """Declaration (interval, burst, limits, concurrency, adaptive, outer, interactive
    share: what is set), interval in force, the units left of each budget, paused, tickets, next
    slot (the one a ticket would get now), bodies running (of a capped bucket's cap), held per
    worker, broker depth and parked tasks (in the bucket's overflow queue) of each bucket:
    the configured ones and those with state in the store (tenant buckets ``queue:key``)."""
    app = app_of(ctx)
    unconfigured: list[str] = []
    if queue:
        found = [(queue, control.status(app, queue))]
    else:
        found, unconfigured = control.statuses(app, match)
    rows = []
    settings = settings_of(app)
    for bucket, result in found:
        row = control.status_dict(result)
        row["queue"] = bucket
        row["burst"] = settings.burst_of(bucket)
        limits = settings.limits_of(bucket)
        row["limits"] = [limit_dict(limit) for limit in limits]
        if result.units_left:
            row["budget_left"] = result.units_left[0]
            for shown, left in zip(row["limits"], result.units_left[1:]):
                shown["budget_left"] = left
        row["interactive_share"] = settings.share_of(bucket)
        row["declaration"] = declaration_of(settings, bucket)
        rows.append(row)
    rows.sort(key=_SORTS[sort_by])
    total = len(rows)
    if top:
        rows = rows[:top]
    names = [row["queue"] for row in rows]
    per_worker, held_error = held_per_worker(app, timeout_s, names) if names else ({}, None)
    configured = set(settings.buckets())
    depths = queue_depths(app, [name for name in names if name in configured])
    overflows = {name: overflow_queue_name(queue_of(name), name) for name in names}
    parked = queue_depths(app, list(overflows.values()))
    for row in rows:
        row["parked"] = parked.get(overflows[row["queue"]]) or 0
        row["held"] = {
            worker: stats.get(row["queue"], {}).get("held", 0)
            for worker, stats in per_worker.items()
        }
        row["held_total"] = sum(row["held"].values())
        row["broker_depth"] = depths.get(row["queue"])
        row["cap"] = settings.concurrency_of(row["queue"])
    if as_json:
        click.echo(
            json.dumps(
                {
                    "queues": rows,
                    "total": total,
                    "shown": len(rows),
                    "unconfigured": len(unconfigured),
                    "workers": sorted(per_worker),
                    "workers_error": held_error,
                }
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="interval buckets")
    columns = ("bucket", "declaration", "interval s", "budget left", "paused", "tickets",
               "next slot in s", "running", "held", "depth", "parked")  # fmt: skip
    for col in columns:
        table.add_column(col)
    for row in rows:
        held = ", ".join(f"{w}={n}" for w, n in sorted(row["held"].items()))
        if row["queue"] in configured:
            depth = "?" if row["broker_depth"] is None else str(row["broker_depth"])
        else:
            depth = "-"  # a tenant bucket shares its queue's depth
        table.add_row(
            row["queue"],
            _declaration_text(row["declaration"]),
            f"{row['interval_s']:g}"
            + (" (set)" if row["overridden"] else "")
            + (" (adapted)" if row["adapted"] else ""),
            _budget_text(row),
            f"by {row['outer']}" if row["outer_paused"] else ("yes" if row["paused"] else "no"),
            str(row["tickets"]),
            f"{row['next_slot_in_s']:.3f}",
            str(row["running"]) + ("" if row["cap"] is None else f"/{row['cap']}"),
            held or ("?" if held_error else "-"),
            depth,
            str(row["parked"]),
        )
    # Piped or captured output keeps whole bucket names (a terminal's width would cut them).
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    more = " (use --top/--match)" if len(rows) < total else ""
    if unconfigured:
        more += f"; {len(unconfigured)} stored buckets have no configured interval"
    console.print(f"showing {len(rows)} of {total} buckets{more}", highlight=False)
    if held_error:
        console.print(f"held: {held_error}", highlight=False)
    elif names and not per_worker:
        console.print(f"held: no worker answered within {timeout_s:g}s", highlight=False)
