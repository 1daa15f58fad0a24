"""Store outages and error replies: logged once each, with a retry backoff that grows while
they last."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from celery_interval.errors import StoreRefused, StoreUnavailable

__all__ = ["StoreOutage"]

logger = logging.getLogger("celery_interval.worker")

#: The retry delay after a store call met an outage that just began (seconds); it doubles
#: with each failed call, up to ``interval_retry_max_s``.
FIRST_BACKOFF_S = 0.05
#: An outage is over once the store answered and no call failed for this long (seconds): a
#: store out of memory refuses only the calls that would grow it, and answers the others.
QUIET_S = 1.0


class StoreOutage:
    """Whether the store is out, since when, and how long a failed call waits to retry.

    Every ``StoreError`` counts: one that is not an outage (a Lua error, a damaged key) is a
    bug that retrying will not cure, but the worker's tasks wait for its fix rather than be
    acked unrun or run twice; it is logged as such, once, at ERROR. The end is logged once
    the store answered and nothing failed for ``QUIET_S`` (with ``timer``; without, at the
    first answer), so a store that answers some calls and refuses others logs one of each.
    """

    def __init__(
        self, retry_max_s: float, held_count: Callable[[], int], timer: Any = None
    ) -> None:
        self._retry_max_s = retry_max_s
        self._held_count = held_count
        self._timer = timer
        self.since: float | None = None
        self.backoff_s = FIRST_BACKOFF_S
        #: Calls failed so far; the end check sees whether one failed since it was armed.
        self._failures = 0
        #: Whether the last call went through.
        self._answered = False
        self._check: Any = None

    def failed(self, exc: Exception) -> None:
        """A store call failed: log the outage once, back off the retries."""
        self._failures += 1
        self._answered = False
        if self.since is None:
            self.since = time.monotonic()
            logger.error(
                "interval store %s (%s): holding %d task(s), retrying with backoff",
                _what(exc),
                exc,
                self._held_count(),
            )
        self.backoff_s = min(self.backoff_s * 2, self._retry_max_s)

    def answered(self) -> None:
        """A store call went through: an outage, if there was one, is over once no call
        fails for ``QUIET_S``."""
        if self.since is None:
            return
        self._answered = True
        self.backoff_s = FIRST_BACKOFF_S
        if self._timer is None:
            self._end()
        elif self._check is None:
            self._arm()

    def _arm(self) -> None:
        self._check = self._timer.call_after(QUIET_S, self._quiet, (self._failures,), priority=8)

    def _quiet(self, failures: int) -> None:
        self._check = None
        if self._failures == failures:
            self._end()
        elif self._answered:  # a call failed since, and a later one went through
            self._arm()

    def _end(self) -> None:
        if self.since is not None:
            logger.warning(
                "interval store reachable again after %.1fs",
                time.monotonic() - self.since,
            )
            self.since = None


def _what(exc: Exception) -> str:
    if isinstance(exc, StoreRefused):
        return "refusing calls"
    if isinstance(exc, StoreUnavailable):
        return "unreachable"
    return "error, not an outage (a bug or a damaged key: it needs a fix)"
