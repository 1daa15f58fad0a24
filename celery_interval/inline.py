"""Starts taken from a bucket by code that is not a task: ``with slot(app, "api"):``."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from celery_interval.app_store import store_of
from celery_interval.config import check_int, settings_of
from celery_interval.control import configured_interval_us
from celery_interval.errors import ConfigurationError, IntervalError, short_repr
from celery_interval.schedule import Claim, ClaimTerms, Grant, Outcome, Pace
from celery_interval.stores.base import Store, TaskCopy

__all__ = ["InlineStart", "SlotTimeout", "Started", "slot"]

#: A claim may come this long before its start; the caller sleeps the rest.
LEAD_US = 5_000
#: A paused bucket is asked again this often.
PAUSED_POLL_S = 0.5


class SlotTimeout(IntervalError):
    """The wait for a start of the bucket would be longer than the caller's ``timeout_s``."""


@dataclass(frozen=True)
class Started:
    """The caller's start: its bucket, its ticket, and how long it waited."""

    bucket: str
    ticket: int
    waited_s: float


#: The store calls of one start, yielding the seconds to sleep between them.
_Steps = Generator[float, None, Started]


class InlineStart:
    """One start of ``bucket`` for the code inside ``with`` or ``async with``: it takes a
    ticket and waits for its slot as a task of the bucket does, counted against the same
    budget (interval, burst, cap), and frees its place in a capped bucket when the block ends.
    In a bucket with an ``interactive_share`` it goes ahead of the tickets, within
    that share (``schedule.front``). ``started`` says when it began."""

    def __init__(self, app: Any, bucket: str, *, cost: int, timeout_s: float | None) -> None:
        check_int(cost, "slot(cost=...)", 1)
        if timeout_s is not None and (
            isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0
        ):
            raise ConfigurationError(
                f"slot(timeout_s=...) must be seconds >= 0 or None, got {short_repr(timeout_s)}"
            )
        settings = settings_of(app)
        self.bucket = bucket
        self.interval_us = configured_interval_us(app, bucket)
        self.burst = settings.burst_of(bucket)
        self.limits = settings.limits_of(bucket)
        if cost > self.burst:
            raise ConfigurationError(
                f"slot({bucket!r}, cost={cost}): the cost exceeds the bucket's burst "
                f"of {self.burst}, so it could never start"
            )
        if any(cost > limit.burst for limit in self.limits):
            raise ConfigurationError(
                f"slot({bucket!r}, cost={cost}): the cost exceeds the burst of one of the "
                f"bucket's limits, so it could never start"
            )
        self.cost = cost
        self.share = settings.share_of(bucket)
        self.timeout_s = timeout_s
        self.store: Store = store_of(app)
        token = uuid.uuid4().hex[:12]
        self.copy = TaskCopy(bucket, f"inline-{token}", 0)
        self.terms = ClaimTerms(
            f"{socket.gethostname()}/inline-{os.getpid()}-{token}",
            settings.lease_us,
            lead_us=LEAD_US,
            cap=settings.concurrency_of(bucket),
            burst=self.burst,
            cost=cost,
            limits=self.limits,
        )
        self.started: Started | None = None

    def __enter__(self) -> Started:
        steps = self._steps()
        while isinstance(step := _advance(steps), float):
            time.sleep(step)
        self.started = step
        return step

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._release()

    async def __aenter__(self) -> Started:
        steps = self._steps()
        while isinstance(step := await asyncio.to_thread(_advance, steps), float):
            await asyncio.sleep(step)
        self.started = step
        return step

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self._release)

    def _pace(self, deadline: float | None) -> Pace:
        not_after_us = (
            None if deadline is None else round(max(0.0, deadline - time.monotonic()) * 1e6)
        )
        return Pace(
            self.interval_us,
            burst=self.burst,
            cost=self.cost,
            not_after_in_us=not_after_us,
            limits=self.limits,
            share=self.share,
        )

    def _steps(self) -> _Steps:
        """Take a ticket (none if its slot is past the deadline), then claim it when due."""
        begun = time.monotonic()
        deadline = None if self.timeout_s is None else begun + self.timeout_s
        grant, claimed = self.store.take(self.copy, self._pace(deadline), self.terms)
        while True:
            if grant.outcome is Outcome.WAIT and (
                deadline is None or time.monotonic() + grant.delay_us / 1e6 <= deadline
            ):  # the bucket's interactive share is spent until then: no ticket yet
                yield grant.delay_us / 1e6
                grant, claimed = self.store.take(self.copy, self._pace(deadline), self.terms)
                continue
            if grant.outcome is Outcome.WAIT:
                raise SlotTimeout(
                    f"interval {self.bucket}: the next start is {grant.delay_us / 1e6:.3f}s "
                    f"away, past slot(timeout_s={self.timeout_s}); no ticket was taken"
                )
            if grant.outcome is not Outcome.OK:
                raise IntervalError(f"interval {self.bucket}: inline grant {grant.outcome.value}")
            wait_s = self._wait_s(grant, claimed)
            if wait_s is None:  # a new epoch or a passed slot: a new ticket
                grant, claimed = self.store.take(self.copy, self._pace(deadline), self.terms)
                continue
            if claimed is not None and claimed.outcome is Outcome.OK:
                yield wait_s  # until the admitted start
                return Started(self.bucket, grant.ticket, time.monotonic() - begun)
            if deadline is not None and time.monotonic() + wait_s > deadline:
                raise SlotTimeout(
                    f"interval {self.bucket}: still waiting after {time.monotonic() - begun:.3f}s "
                    f"({self._why(grant, claimed)}), past slot(timeout_s={self.timeout_s}); "
                    f"ticket {grant.ticket}'s slot goes unused"
                )
            yield wait_s
            claimed = self.store.claim(
                self.copy, self.interval_us, grant.slot, self.terms, ticket=grant.ticket
            )

    @staticmethod
    def _wait_s(grant: Grant, claimed: Claim | None) -> float | None:
        """Seconds until the next store call (or the start, when admitted); None: retake."""
        if claimed is None:
            return PAUSED_POLL_S if grant.paused else max(0, grant.delay_us - LEAD_US) / 1e6
        outcome = claimed.outcome
        if outcome is Outcome.OK or outcome is Outcome.FULL:
            return max(0, claimed.delay_us) / 1e6
        if outcome is Outcome.WAIT:
            return max(0, claimed.delay_us - LEAD_US) / 1e6
        if outcome is Outcome.PAUSED:
            return PAUSED_POLL_S
        if outcome is Outcome.RETICKET:
            return None
        raise IntervalError(f"interval: inline claim {outcome.value}")

    @staticmethod
    def _why(grant: Grant, claimed: Claim | None) -> str:
        if claimed is None:
            return "paused" if grant.paused else "its slot is not due"
        return {
            Outcome.FULL: "every place of the bucket's cap is taken",
            Outcome.PAUSED: "paused",
        }.get(claimed.outcome, "its slot is not due")

    def _release(self) -> None:
        if self.terms.cap is not None and self.started is not None:
            self.store.release(self.copy)


def _advance(steps: _Steps) -> float | Started:
    """The next sleep of ``steps``, or the start it ended with (a StopIteration cannot cross
    from a thread into a coroutine)."""
    try:
        return float(next(steps))
    except StopIteration as done:
        started: Started = done.value
        return started


def slot(app: Any, bucket: str, *, cost: int = 1, timeout_s: float | None = None) -> InlineStart:
    """A start of ``bucket`` for code that is not a task (a web request, a script), from the
    same budget as the bucket's tasks: ``with slot(app, "api"): call()``, or ``async with``.

    It queues behind the tickets already granted, as a task would, for at most ``timeout_s``
    (None: as long as it takes): when its slot would be later, ``SlotTimeout`` is raised
    before any ticket is taken. A bucket with an ``interactive_share`` puts it ahead
    of the tickets instead, at the next start its budget allows, within that share of the
    rate. ``cost`` is in units of the bucket's budget (its burst)."""
    return InlineStart(app, bucket, cost=cost, timeout_s=timeout_s)
