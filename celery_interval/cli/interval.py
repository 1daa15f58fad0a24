"""``celery -A proj interval …``: status, pause, unpause, set, unset, reset and ledger export."""

from __future__ import annotations

import json
from typing import Any

import click

from celery_interval import control
from celery_interval.cli.common import app_of, fail_on_interval_errors
from celery_interval.cli.exporter import exporter
from celery_interval.cli.status import status
from celery_interval.cli.top import top
from celery_interval.config import settings_of
from celery_interval.config.intervals import bare_seconds_note, describe_interval
from celery_interval.schedule import Status

__all__ = ["interval"]

#: Every sub-command's ``--json``: one JSON object on stdout instead of the line for people.
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")


def _report(queue: str, result: Status, as_json: bool, line: str, **extra: Any) -> None:
    """The bucket's status (``control.status_dict``) with its queue and ``extra`` as one JSON
    object, or ``line``."""
    if as_json:
        click.echo(json.dumps({"queue": queue, **control.status_dict(result), **extra}))
    else:
        click.echo(line)


@click.group(name="interval")
def interval() -> None:
    """Inspect and control interval queues (works with no worker running)."""


interval.add_command(status)
interval.add_command(exporter)
interval.add_command(top)


@interval.command()
@click.argument("queue")
@json_option
@click.pass_context
@fail_on_interval_errors
def pause(ctx: click.Context, queue: str, as_json: bool) -> None:
    """Pause QUEUE for the whole pool (kept in the store)."""
    _report(queue, control.pause(app_of(ctx), queue), as_json, f"paused {queue}")


@interval.command()
@click.argument("queue")
@json_option
@click.pass_context
@fail_on_interval_errors
def unpause(ctx: click.Context, queue: str, as_json: bool) -> None:
    """Resume QUEUE; held tasks keep their order and spacing."""
    _report(queue, control.unpause(app_of(ctx), queue), as_json, f"unpaused {queue}")


@interval.command(name="set", context_settings={"ignore_unknown_options": True})
@click.argument("queue")
@click.argument("interval_value", metavar="INTERVAL")
@json_option
@click.pass_context
@fail_on_interval_errors
def set_(ctx: click.Context, queue: str, interval_value: str, as_json: bool) -> None:
    """Set QUEUE's interval for the whole pool: seconds between starts (0.5, 500ms, 2s) or a
    rate of starts (10/s, 30/m, 100/h)."""
    result = control.set_interval(app_of(ctx), queue, interval_value)
    note = bare_seconds_note(interval_value, result.interval_us)
    if note:
        click.echo(note, err=True)
    _report(queue, result, as_json, f"{queue}: interval {describe_interval(result.interval_us)}")


@interval.command()
@click.argument("queue")
@json_option
@click.pass_context
@fail_on_interval_errors
def unset(ctx: click.Context, queue: str, as_json: bool) -> None:
    """Drop QUEUE's interval override (from set): its configured interval is back, with no
    new epoch (tickets, pause and granted slots are kept)."""
    result = control.unset_interval(app_of(ctx), queue)
    shown = describe_interval(result.status.interval_us)
    done = "override dropped" if result.dropped else "no interval override to drop"
    line = f"{queue}: {done}; interval {shown}, as configured"
    _report(queue, result.status, as_json, line, dropped=result.dropped)


@interval.command()
@click.argument("queue")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_context
@fail_on_interval_errors
def reset(ctx: click.Context, queue: str, yes: bool, as_json: bool) -> None:
    """Forget QUEUE's state (pause, override, tickets): a new epoch starts."""
    app = app_of(ctx)
    control.configured_interval_us(app, queue)  # an unknown queue fails before the question
    if not yes:
        click.confirm(f"reset {queue}? held tasks will be re-ticketed", abort=True, err=as_json)
    control.reset(app, queue)
    click.echo(json.dumps({"queue": queue, "reset": True}) if as_json else f"reset {queue}")


@interval.group(name="ledger")
def ledger_group() -> None:
    """Each bucket's ledger: every grant, claim outcome and control action."""


@ledger_group.command(name="export")
@click.option(
    "--out",
    required=True,
    help="A file (JSON lines), a directory (existing or ending in /) of part files, or - for "
    "stdout.",
)
@click.option(
    "--bucket",
    "buckets",
    multiple=True,
    help="Only this bucket (repeatable). Default: every bucket with a ledger (found by SCAN).",
)
@click.option(
    "--since",
    default=None,
    help="Only entries from then on, on the store's clock: 90s, 30m, 2h, 1d ago; an ISO 8601 "
    "time (naive = UTC); or Unix seconds.",
)
@click.option(
    "--part-entries",
    default=1_000_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Entries per part file (directory output).",
)
@click.option(
    "--chunk",
    default=5_000,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="Entries per XRANGE round trip.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (entries, per bucket, out); not with --out - (stdout has them).",
)
@click.pass_context
@fail_on_interval_errors
def ledger_export(
    ctx: click.Context,
    out: str,
    buckets: tuple[str, ...],
    since: str | None,
    part_entries: int,
    chunk: int,
    as_json: bool,
) -> None:
    """Write ledgers as JSON lines (one object per entry, with its bucket and stream id)."""
    from celery_interval import ledger

    if as_json and out == "-":
        raise click.UsageError("--json needs --out FILE or DIR: with --out - stdout is the ledger")
    app = app_of(ctx)
    if settings_of(app).ledger_max == 0:
        click.echo(
            "note: interval_ledger_max=0, the ledger is off; exporting what is left", err=True
        )
    reader = ledger.reader_for_app(app)
    try:
        since_us = None if since is None else ledger.parse_since_us(since, reader.now_us())
        result = ledger.export(
            reader,
            out,
            buckets=list(buckets),
            since_us=since_us,
            chunk=chunk,
            part_entries=part_entries,
        )
    finally:
        reader.close()
    for bucket, count in result.per_bucket.items():
        if count == 0:
            click.echo(f"note: no ledger entries for bucket {bucket!r}", err=True)
    if as_json:
        summary = {"entries": result.entries, "per_bucket": result.per_bucket, "out": out}
        click.echo(json.dumps(summary))
        return
    where = "stdout" if out == "-" else out
    click.echo(
        f"exported {result.entries} entries of {len(result.per_bucket)} buckets to {where}",
        err=out == "-",
    )
