"""The store's births a worker saw: a new one means the store lost its state, so the done
marks of the bodies that ran here are written again."""

from __future__ import annotations

import logging

from celery_interval.schedule import MARKS_SETTLE_US
from celery_interval.worker.done import DoneMarks

__all__ = ["Births"]

logger = logging.getLogger("celery_interval.worker")


class Births:
    """The store's birth marker as this worker's claims found it (``Claim.born_us``).

    ``latest_us`` goes with every claim (``ClaimTerms.knew_born_us``): a claim that meets a
    later birth holds every new start for ``MARKS_SETTLE_US`` from then
    (``schedule.places.marks_settle_until_us``) while each worker that comes back writes again
    the done marks of what ran on it, so that a copy of a task that ran on another worker,
    handed back by the broker, is still dropped.
    """

    def __init__(self, done: DoneMarks) -> None:
        self.done = done
        #: The last birth seen (None: none yet, or a store without a marker: a Cluster).
        self.latest_us: int | None = None

    def saw(self, born_us: int | None) -> None:
        """A claim's answer carried ``born_us``."""
        if born_us is None or born_us == self.latest_us:
            return
        if self.latest_us is None:
            self.latest_us = born_us
            return
        self.latest_us = born_us
        written = self.done.write_again(born_us)
        logger.warning(
            "interval: the store was born again at %d (it lost its state): the done marks of "
            "%d task(s) that ran here go to it again; new starts wait %.0fs for the other "
            "workers' marks",
            born_us,
            written,
            MARKS_SETTLE_US / 1e6,
        )
