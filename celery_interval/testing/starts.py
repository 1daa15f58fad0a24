"""What started when: a bucket's admitted starts read from its ledger, and the spacing check."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery_interval.config.intervals import parse_interval_us
from celery_interval.ledger import reader_for_app
from celery_interval.starts import happened

__all__ = ["Start", "assert_spaced", "ledger_starts", "wait_for_starts"]


@dataclass(frozen=True)
class Start:
    """One admitted start of a bucket, on the store's clock (µs since the Unix epoch)."""

    #: When the start was admitted to begin: the ledger's ``start`` (store clock, µs).
    at_us: int
    #: The task's ticket in its bucket; tickets follow the order the workers took the tasks.
    ticket: int
    #: The task id (a task replaced with ``self.replace`` carries its nesting after it).
    task_id: str = ""
    #: The bucket's epoch: tickets count again from 1 in a new epoch.
    epoch: int = 0
    #: The interval in force at the claim, µs (0 when unknown).
    interval_us: int = 0
    #: The worker (and pool process) it was leased to.
    holder: str = ""
    #: A new start claimed for a task that missed its admitted one (the missed slot stays empty).
    readmit: bool = False


def ledger_starts(app: Any, bucket: str) -> list[Start]:
    """Every admitted start of ``bucket`` in its ledger, in start order: each first OK claim
    (a holder's repeated claim of the same start is left out, and a start its holder missed
    that a moved readmit replaced). Needs a Redis store."""
    reader = reader_for_app(app)
    try:
        entries = list(reader.entries(bucket))
    finally:
        reader.close()
    starts = [
        Start(
            at_us=int(entry["start"]),
            ticket=int(entry.get("ticket", 0)),
            task_id=str(entry.get("task", "")),
            epoch=int(entry.get("epoch", 0)),
            interval_us=int(entry.get("interval", 0)),
            holder=str(entry.get("holder", "")),
            readmit=entry.get("readmit") == 1,
        )
        for entry in happened(entries)
    ]
    return sorted(starts, key=lambda s: s.at_us)


def wait_for_starts(
    app: Any, bucket: str, count: int, timeout_s: float = 30.0, poll_s: float = 0.05
) -> list[Start]:
    """Poll ``bucket``'s ledger until ``count`` tasks have started (a task that started
    again under its ticket, a readmit, counts once); an ``AssertionError`` after
    ``timeout_s`` says how many did."""
    deadline = time.monotonic() + timeout_s
    while True:
        starts = ledger_starts(app, bucket)
        started = len({s.task_id for s in starts})
        if started >= count:
            return starts
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"only {started} of {count} tasks started in bucket {bucket!r} after {timeout_s}s"
            )
        time.sleep(poll_s)


def assert_spaced(
    starts: Sequence[Start], interval: float | str | None = None, *, in_order: bool = True
) -> None:
    """Fail unless no two ``starts`` are closer than ``interval`` (seconds or a rate such as
    ``"20/s"``; default: each later start's own interval in force) and, with ``in_order``,
    unless they started in ticket order within each epoch (readmits aside)."""
    fixed_us = None if interval is None else parse_interval_us(interval, name="interval")
    ordered = sorted(starts, key=lambda s: s.at_us)
    close = []
    for a, b in itertools.pairwise(ordered):
        want_us = b.interval_us if fixed_us is None else fixed_us
        if b.at_us - a.at_us < want_us:
            close.append(
                f"tickets {a.ticket} and {b.ticket} started {(b.at_us - a.at_us) / 1e3:.3f} ms "
                f"apart (interval {want_us / 1e3:.3f} ms)"
            )
    problems = close[:10] + ([f"… and {len(close) - 10} more"] if len(close) > 10 else [])
    if in_order:
        firsts = [s for s in ordered if not s.readmit]
        passed = [
            (a.ticket, b.ticket)
            for a, b in itertools.pairwise(firsts)
            if a.epoch == b.epoch and b.ticket < a.ticket
        ]
        if passed:
            problems.append(f"out of ticket order: {passed[:10]}")
    if problems:
        raise AssertionError(
            f"{len(ordered)} starts not spaced as promised:\n  " + "\n  ".join(problems)
        )
