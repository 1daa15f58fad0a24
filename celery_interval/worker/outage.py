"""Store outages: logged once each, with a retry backoff that grows while the outage lasts."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["StoreOutage"]

logger = logging.getLogger("celery_interval.worker")

#: The retry delay after a store call met an outage that just began (seconds); it doubles
#: with each failed call, up to ``interval_retry_max_s``.
FIRST_BACKOFF_S = 0.05


class StoreOutage:
    """Whether the store is out, since when, and how long a failed call waits to retry."""

    def __init__(self, retry_max_s: float, held_count: Callable[[], int]) -> None:
        self._retry_max_s = retry_max_s
        self._held_count = held_count
        self.since: float | None = None
        self.backoff_s = FIRST_BACKOFF_S

    def failed(self, exc: Exception) -> None:
        """The store could not be reached: log the outage once, back off the retries."""
        if self.since is None:
            self.since = time.monotonic()
            logger.error(
                "interval store unreachable (%s): holding %d task(s), retrying with backoff",
                exc,
                self._held_count(),
            )
        self.backoff_s = min(self.backoff_s * 2, self._retry_max_s)

    def answered(self) -> None:
        """A store call went through: an outage, if there was one, is over."""
        if self.since is not None:
            logger.warning(
                "interval store reachable again after %.1fs",
                time.monotonic() - self.since,
            )
            self.since = None
            self.backoff_s = FIRST_BACKOFF_S
