"""``celery -A proj interval status``: each bucket's state, held tasks, depth and parked tasks."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from celery_interval import control
from celery_interval.app_store import store_of
from celery_interval.buckets import overflow_queue_name, queue_of
from celery_interval.cli.common import app_of, fail_on_interval_errors
from celery_interval.config import Settings, settings_of
from celery_interval.config.intervals import describe_rate
from celery_interval.config.values import describe_limits, limit_dict
from celery_interval.errors import UnknownBucket
from celery_interval.monitor.fleet import held_per_worker, queue_depths
from celery_interval.schedule import Status
from celery_interval.shares import achieved_rates, with_shares

if TYPE_CHECKING:
    from rich.table import Table

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
    the configured ones and those with state in the store (tenant buckets ``queue:key``); a
    bucket nested in a fair outer, its share of the outer's starts now, weight and starts a
    second over the last 10 s."""
    app = app_of(ctx)
    found, unconfigured = _found(app, queue, match)
    settings = settings_of(app)
    rows = [_status_row(settings, bucket, result) for bucket, result in found]
    rows.sort(key=_SORTS[sort_by])
    total = len(rows)
    if top:
        rows = rows[:top]
    configured = set(settings.buckets())
    per_worker, held_error = _add_fleet(app, settings, configured, rows, timeout_s)
    _add_shares(app, rows)
    shown = _Shown(rows, total, unconfigured, configured, per_worker, held_error)
    if as_json:
        click.echo(_json_text(shown))
        return
    _print_table(shown, timeout_s)


@dataclass
class _Shown:
    """What ``status`` shows: the rows kept (sorted, cut to ``--top``), how many buckets there
    were, the stored buckets no configured interval names, the buckets configured by name, and
    the held inspect's answer (held per worker, its error)."""

    rows: list[dict[str, Any]]
    total: int
    unconfigured: list[str]
    configured: set[str]
    per_worker: dict[str, dict[str, Any]]
    held_error: str | None


def _found(app: Any, queue: str | None, match: str) -> tuple[list[tuple[str, Status]], list[str]]:
    """The (bucket, status) of ``queue`` alone, or of every bucket whose name matches
    ``match``; and the stored buckets that no configured interval names."""
    if queue:
        return [(queue, control.status(app, queue))], []
    return control.statuses(app, match)


def _status_row(settings: Settings, bucket: str, result: Status) -> dict[str, Any]:
    """``bucket``'s row: its status, burst, extra limits (with the units left of each budget
    when read), interactive share and declaration."""
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
    return row


def _add_fleet(
    app: Any,
    settings: Settings,
    configured: set[str],
    rows: list[dict[str, Any]],
    timeout_s: float,
) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Add to each row what the workers and the broker say: the tasks held per worker (and
    in all), the broker depth (of a configured bucket), the parked tasks and the cap; the held
    inspect's answer per worker and its error."""
    names = [row["queue"] for row in rows]
    per_worker, held_error = held_per_worker(app, timeout_s, names) if names else ({}, None)
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
    return per_worker, held_error


def _add_shares(app: Any, rows: list[dict[str, Any]]) -> None:
    """Add to each row of a bucket nested in a fair outer its place in the outer's share,
    its achieved rate (starts a second over the last 10 s, its ledger) and its backlog (held
    and parked)."""
    with_shares(settings_of(app), store_of(app), {row["queue"]: row for row in rows})
    fair = [row for row in rows if "fair" in row]
    rates = achieved_rates(app, [row["queue"] for row in fair]) if fair else {}
    for row in fair:
        row["fair"]["rate_per_s"] = rates.get(row["queue"])
        row["fair"]["backlog"] = row["held_total"] + row["parked"]


def _json_text(shown: _Shown) -> str:
    """``--json``: one JSON object of the rows, the counts and the workers that answered."""
    return json.dumps(
        {
            "queues": shown.rows,
            "total": shown.total,
            "shown": len(shown.rows),
            "unconfigured": len(shown.unconfigured),
            "workers": sorted(shown.per_worker),
            "workers_error": shown.held_error,
        }
    )


def _print_table(shown: _Shown, timeout_s: float) -> None:
    """Print the rows as a table, then how many are shown and what the held inspect lacked."""
    from rich.console import Console

    # Piped or captured output keeps whole bucket names (a terminal's width would cut them).
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(_table(shown))
    for line in _footer_lines(shown, timeout_s):
        console.print(line, highlight=False)


def _table(shown: _Shown) -> Table:
    """The ``interval buckets`` table: a row per bucket shown."""
    from rich.table import Table

    table = Table(title="interval buckets")
    columns = ["bucket", "declaration", "interval s", "budget left", "paused", "tickets",
               "next slot in s", "running", "held", "depth", "parked"]  # fmt: skip
    fair = any("fair" in row or "fair_error" in row for row in shown.rows)
    for col in columns + (["fair share"] if fair else []):
        table.add_column(col)
    for row in shown.rows:
        table.add_row(*_cells(row, shown), *([_share_text(row)] if fair else []))
    return table


def _share_text(row: dict[str, Any]) -> str:
    """A fair outer's key: its share of the outer's starts now, weight and achieved rate,
    ``'0.25 of api, w 1, 9.8/s'`` (``?``: the share could not be read; ``-``: not fair)."""
    if "fair_error" in row:
        return "?"
    fair = row.get("fair")
    if fair is None:
        return "-"
    rate = "?" if fair.get("rate_per_s") is None else f"{fair['rate_per_s']:.1f}/s"
    return f"{fair['share']:.2f} of {fair['outer']}, w {fair['weight']}, {rate}"


def _cells(row: dict[str, Any], shown: _Shown) -> list[str]:
    """``row``'s cells, in the table's column order."""
    return [
        row["queue"],
        _declaration_text(row["declaration"]),
        _interval_text(row),
        _budget_text(row),
        f"by {row['outer']}" if row["outer_paused"] else ("yes" if row["paused"] else "no"),
        str(row["tickets"]),
        f"{row['next_slot_in_s']:.3f}",
        str(row["running"]) + ("" if row["cap"] is None else f"/{row['cap']}"),
        _held_text(row, shown.held_error),
        _depth_text(row, shown.configured),
        str(row["parked"]),
    ]


def _interval_text(row: dict[str, Any]) -> str:
    """The interval in force in seconds, marked ``(set)`` and ``(adapted)`` where it is."""
    return (
        f"{row['interval_s']:g}"
        + (" (set)" if row["overridden"] else "")
        + (" (adapted)" if row["adapted"] else "")
    )


def _held_text(row: dict[str, Any], held_error: str | None) -> str:
    """The tasks each worker holds, ``'w1=2, w2=0'`` (``?``: the inspect failed; ``-``: no
    worker answered)."""
    held = ", ".join(f"{w}={n}" for w, n in sorted(row["held"].items()))
    return held or ("?" if held_error else "-")


def _depth_text(row: dict[str, Any], configured: set[str]) -> str:
    """The broker depth of a configured bucket (``?``: unknown); ``-`` for a tenant bucket,
    which shares its queue's depth."""
    if row["queue"] not in configured:
        return "-"
    return "?" if row["broker_depth"] is None else str(row["broker_depth"])


def _footer_lines(shown: _Shown, timeout_s: float) -> list[str]:
    """The lines under the table: how many buckets are shown (and why not all), and what
    the held inspect lacked."""
    more = " (use --top/--match)" if len(shown.rows) < shown.total else ""
    if shown.unconfigured:
        more += f"; {len(shown.unconfigured)} stored buckets have no configured interval"
    lines = [f"showing {len(shown.rows)} of {shown.total} buckets{more}"]
    if shown.held_error:
        lines.append(f"held: {shown.held_error}")
    elif shown.rows and not shown.per_worker:
        lines.append(f"held: no worker answered within {timeout_s:g}s")
    return lines
