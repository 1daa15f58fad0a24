"""The ``celery-interval`` program: the demo and the Spark audit of exported ledgers."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Any

import click

from celery_interval.errors import IntervalError

__all__ = ["main"]


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
    from celery_interval.config.intervals import parse_interval_us
    from celery_interval.demo import DemoOptions, run_demo

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
    from celery_interval.config.intervals import parse_interval_us

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
@click.option(
    "--master",
    default="local[*]",
    show_default=True,
    help="Spark master URL (local[*], spark://host:port), or sc://host:port for Spark Connect.",
)
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

    Exit status 0 when every bucket kept its interval (or burst budget) and every extra limit
    its claims name, with no duplicate start; 1 otherwise.
    """
    from celery_interval.spark import missing_requirement

    for path in ledgers:
        if "://" not in path and not os.path.exists(path):
            raise click.BadParameter(f"{path!r}: no such file or directory", param_hint="LEDGER")
    why = missing_requirement()
    if why:
        raise click.ClickException(why)
    from celery_interval.spark.audit import main as audit_main
    from celery_interval.spark.page import limits_text

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
        limits = limits_text(row["limits"])
        click.echo(
            f"{verdict:4} {row['bucket']}: {row['starts']} starts, {row['violations']} "
            f"violations, {row['duplicate_starts']} duplicate starts, min gap {row['min_gap_s']}s"
            + (f"; limits (violations): {limits}" if limits else "")
        )
    click.echo(f"report: {os.path.join(out_dir, 'report.html')}")
    if not summary["ok"]:
        sys.exit(1)
