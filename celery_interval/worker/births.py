"""The store's births a worker saw: a new one means the store lost its state, so the done
marks of the bodies that ran here are written again."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from celery_interval.errors import StoreError
from celery_interval.schedule import MARKS_SETTLE_US
from celery_interval.stores.base import Store
from celery_interval.worker.done import DoneMarks

__all__ = ["Births"]

logger = logging.getLogger("celery_interval.worker")

#: How often a worker whose bodies ran reads the store's birth marker (seconds): a third of
#: the settle window.
LOOK_S = MARKS_SETTLE_US / 3e6


class Births:
    """The store's birth marker as this worker's claims found it (``Claim.born_us``).

    ``latest_us`` goes with every claim (``ClaimTerms.knew_born_us``): a claim that meets a
    later birth holds every new start for ``MARKS_SETTLE_US`` from then
    (``schedule.places.marks_settle_until_us``) while each worker that comes back writes again
    the done marks of what ran on it, so that a copy of a task that ran on another worker,
    handed back by the broker, is still dropped.

    A worker whose pool processes are all busy makes no claim of its own, so while bodies
    that ran here are remembered it also reads the marker every ``LOOK_S`` (``watch``): its
    marks go again within that, well inside the settle window, claims or not.
    """

    def __init__(self, done: DoneMarks, store: Store | None = None, timer: Any = None) -> None:
        self.done = done
        self.store = store
        self.timer = timer
        #: The last birth a claim's answer carried, which the next claims carry (None: none
        #: yet, or a store without a marker: a Cluster). A birth only read (``look``) waits
        #: for a claim to carry it, so the first claim still opens the settle window.
        self.latest_us: int | None = None
        #: The last birth seen, by a claim or a read.
        self._known_us: int | None = None
        self._entry: Any = None

    def watch(self) -> None:
        """A body began here: read the birth marker every ``LOOK_S`` while any is remembered."""
        if self._entry is None and self.timer is not None:
            self._entry = self.timer.call_after(LOOK_S, self.look, priority=8)

    def look(self) -> None:
        """Read the birth marker (a store that fails is read at the next look)."""
        self._entry = None
        if self.store is None:
            return
        with contextlib.suppress(StoreError):
            self.saw(self.store.born_us(), claimed=False)
        if self.done.remembers():
            self.watch()

    def saw(self, born_us: int | None, *, claimed: bool = True) -> None:
        """A claim's answer (``claimed``), or a look, found ``born_us``."""
        if born_us is None:
            return
        if claimed:
            self.latest_us = born_us
        known, self._known_us = self._known_us, born_us
        if known is None or born_us == known:
            return
        written = self.done.write_again(born_us)
        logger.warning(
            "interval: the store was born again at %d (it lost its state): the done marks of "
            "%d task(s) that ran here go to it again; new starts wait %.0fs for the other "
            "workers' marks",
            born_us,
            written,
            MARKS_SETTLE_US / 1e6,
        )
