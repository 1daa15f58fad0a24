"""Command lines: ``celery -A proj interval …`` and the ``celery-interval`` program."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from typing import Any

import click

from celery_interval import control
from celery_interval.buckets import overflow_queue_name, queue_of
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


def _queue_depths(app: Any, queues: list[str]) -> dict[str, int | None]:
    """Each queue's broker depth (None where the broker does not answer), on one connection."""
    depths: dict[str, int | None] = dict.fromkeys(queues)
    if not queues:
        return depths
    try:
        with app.connection_for_read() as conn:
            for queue in queues:
                try:
                    channel = conn.channel()  # a failed passive declare closes its channel
                    try:
                        reply = channel.queue_declare(queue, passive=True)
                        depths[queue] = int(reply.message_count)
                    finally:
                        channel.close()
                except Exception:
                    depths[queue] = None
    except Exception:
        pass
    return depths


def _held_per_worker(app: Any, timeout_s: float, buckets: list[str]) -> dict[str, dict[str, Any]]:
    """Each worker's ``interval_stats`` of ``buckets`` (held counts only, no task lists)."""
    try:
        replies = app.control.inspect(timeout=timeout_s)._request(
            "interval_stats", top=0, tasks=0, buckets=buckets
        )
        return replies or {}
    except Exception:
        return {}


#: ``--sort`` keys: the most backed-up (latest next slot) or most ticketed first, or by name.
_SORTS: dict[str, Any] = {
    "next": lambda row: (-row["next_slot_in_s"], row["queue"]),
    "ticket": lambda row: (-row["tickets"], row["queue"]),
    "name": lambda row: row["queue"],
}


@click.group(name="interval")
def interval() -> None:
    """Inspect and control interval queues (works with no worker running)."""


@interval.command()
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
@_fail_on_interval_errors
def status(
    ctx: click.Context,
    queue: str | None,
    match: str,
    top: int,
    sort_by: str,
    as_json: bool,
    timeout_s: float,
) -> None:
    """Interval, paused, tickets, next slot, held per worker, broker depth and parked tasks
    (in the bucket's overflow queue) of each bucket:
    the configured ones and those with state in the store (tenant buckets ``queue:key``)."""
    app = _app(ctx)
    unconfigured: list[str] = []
    if queue:
        found = [(queue, control.status(app, queue))]
    else:
        found, unconfigured = control.statuses(app, match)
    rows = []
    for bucket, result in found:
        row = control.status_dict(result)
        row["queue"] = bucket
        rows.append(row)
    rows.sort(key=_SORTS[sort_by])
    total = len(rows)
    if top:
        rows = rows[:top]
    names = [row["queue"] for row in rows]
    per_worker = _held_per_worker(app, timeout_s, names) if names else {}
    configured = set(settings_of(app).buckets())
    depths = _queue_depths(app, [name for name in names if name in configured])
    overflows = {name: overflow_queue_name(queue_of(name), name) for name in names}
    parked = _queue_depths(app, list(overflows.values()))
    for row in rows:
        row["parked"] = parked.get(overflows[row["queue"]]) or 0
        row["held"] = {
            worker: stats.get(row["queue"], {}).get("held", 0)
            for worker, stats in per_worker.items()
        }
        row["broker_depth"] = depths.get(row["queue"])
    if as_json:
        click.echo(
            json.dumps(
                {
                    "queues": rows,
                    "total": total,
                    "shown": len(rows),
                    "unconfigured": len(unconfigured),
                }
            )
        )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="interval buckets")
    columns = ("bucket", "interval s", "paused", "tickets", "next slot in s", "held", "depth",
               "parked")  # fmt: skip
    for col in columns:
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
            str(row["parked"]),
        )
    # Piped or captured output keeps whole bucket names (a terminal's width would cut them).
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    more = " (use --top/--match)" if len(rows) < total else ""
    if unconfigured:
        more += f"; {len(unconfigured)} stored buckets have no configured interval"
    console.print(f"showing {len(rows)} of {total} buckets{more}", highlight=False)


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


@interval.command(name="set", context_settings={"ignore_unknown_options": True})
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
    app = _app(ctx)
    control.configured_interval_us(app, queue)  # an unknown queue fails before the question
    if not yes:
        click.confirm(f"reset {queue}? held tasks will be re-ticketed", abort=True)
    control.reset(app, queue)
    click.echo(f"reset {queue}")


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
@click.pass_context
@_fail_on_interval_errors
def ledger_export(
    ctx: click.Context,
    out: str,
    buckets: tuple[str, ...],
    since: str | None,
    part_entries: int,
    chunk: int,
) -> None:
    """Write ledgers as JSON lines (one object per entry, with its bucket and stream id)."""
    from celery_interval import ledger

    app = _app(ctx)
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
    where = "stdout" if out == "-" else out
    click.echo(
        f"exported {result.entries} entries of {len(result.per_bucket)} buckets to {where}",
        err=out == "-",
    )


@click.group()
@click.version_option(package_name="celery-interval", prog_name="celery-interval")
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


def _intervals_of(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> Any:
    from celery_interval.intervals import parse_interval_us

    found: dict[str, int] = {}
    for value in values:
        bucket, sep, seconds = value.partition("=")
        if not sep or not bucket:
            raise click.BadParameter(f"{value!r}: expected BUCKET=SECONDS (or a rate, api=10/s)")
        try:
            found[bucket] = parse_interval_us(seconds, name=f"--interval-of {bucket}")
        except IntervalError as exc:
            raise click.BadParameter(str(exc)) from None
    return found


#: Spark error classes that only wrap the failures that say what went wrong.
_SPARK_WRAPPERS = ("[STAGE_MATERIALIZATION_MULTIPLE_FAILURES]",)


def _spark_error(exc: Exception) -> str:
    """The line of a Spark error that says what failed (``[ERROR_CLASS] …``, naming the file),
    looked for in the JVM's exception and its causes, past wrappers of several failures."""
    texts = [str(exc)]
    java = getattr(exc, "java_exception", None)  # py4j: the JVM's own message is the useful one
    chain: list[Any] = []
    with contextlib.suppress(Exception):
        while java is not None and len(chain) < 20:
            chain.append(java)
            java = java.getCause()
        texts += [str(e.toString()) for e in chain]  # the first failure is the cause
        texts += [str(x.toString()) for e in chain for x in (e.getSuppressed() or ())]
    lines = [line.strip() for text in texts for line in text.splitlines() if line.strip()]
    found = [m.group(0) for line in lines if (m := re.search(r"\[[A-Z_.]+\].*", line))]
    for line in found:
        if not line.startswith(_SPARK_WRAPPERS):
            return line
    return found[0] if found else (lines[0] if lines else type(exc).__name__)


def _spark_conf(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> Any:
    found: dict[str, str] = {}
    for value in values:
        key, sep, setting = value.partition("=")
        if not sep or not key.strip() or not setting:
            raise click.BadParameter(f"{value!r}: expected KEY=VALUE (spark.driver.memory=4g)")
        found[key.strip()] = setting
    return found


@main.command()
@click.argument("ledgers", nargs=-1, required=True, metavar="LEDGER...")
@click.option("--out", "out_dir", required=True, help="Directory for the summary, plots, report.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option(
    "--interval-of",
    "intervals_us",
    multiple=True,
    callback=_intervals_of,
    metavar="BUCKET=SECONDS",
    help="Audit BUCKET against this interval instead of the one its ledger records (repeatable).",
)
@click.option(
    "--conf",
    "spark_conf",
    multiple=True,
    callback=_spark_conf,
    metavar="KEY=VALUE",
    help="A Spark setting for the session (repeatable), e.g. spark.driver.memory=4g.",
)
@click.option(
    "--plot-buckets",
    default=20,
    show_default=True,
    type=click.IntRange(min=0),
    help="Plot at most this many buckets (failing ones first, then the busiest).",
)
def audit(
    ledgers: tuple[str, ...],
    out_dir: str,
    master: str,
    intervals_us: dict[str, int],
    spark_conf: dict[str, str],
    plot_buckets: int,
) -> None:
    """Audit exported ledgers (files or directories of JSON lines, or Parquet) with Spark.

    Exit status 0 when every bucket kept its interval with no duplicate start, 1 otherwise.
    """
    from celery_interval.spark import missing_requirement

    for path in ledgers:
        if "://" not in path and not os.path.exists(path):
            raise click.BadParameter(f"{path!r}: no such file or directory", param_hint="LEDGER")
    why = missing_requirement()
    if why:
        raise click.ClickException(why)
    from celery_interval.spark.audit import main as audit_main

    try:
        summary = audit_main(
            ledgers,
            out_dir,
            master=master,
            intervals_us=intervals_us,
            plot_buckets=plot_buckets,
            conf=spark_conf,
        )
    except Exception as exc:
        if not type(exc).__module__.startswith(("pyspark", "py4j")):
            raise
        raise click.ClickException(f"the Spark audit failed: {_spark_error(exc)}") from exc
    for row in summary["buckets"]:
        verdict = "ok" if row["ok"] else "FAIL"
        click.echo(
            f"{verdict:4} {row['bucket']}: {row['starts']} starts, {row['violations']} "
            f"violations, {row['duplicate_starts']} duplicate starts, min gap {row['min_gap_s']}s"
        )
    click.echo(f"report: {os.path.join(out_dir, 'report.html')}")
    if not summary["ok"]:
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover - `python -m celery_interval.cli`
    main()
