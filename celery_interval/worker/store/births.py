"""The store's births a worker saw: a new one means the store lost its state, so the done
marks of the bodies that ran here are written again."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from celery_interval.errors import StoreError
from celery_interval.schedule import MARKS_SETTLE_US
from celery_interval.stores.base import Store
from celery_interval.worker.store.done import DoneMarks

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
    marks go again within that, well inside the settle window, claims or not. Celery runs no
    timer while it reconnects to the broker, so from the channel's loss until it is back
    (``off_loop``, ``on_loop``) the reads run on a thread of their own and a new birth's marks
    are posted from there (``DoneMarks.write_again_now``).
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
        #: While the channel is lost, the run of reads on a thread of their own (the loop's
        #: timer does not run); None: the loop's.
        self._off_loop: object | None = None

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

    def off_loop(self) -> None:
        """The channel is lost: while bodies that ran here are remembered, read the marker on a
        thread of its own until ``on_loop``."""
        if self._off_loop is None and self.done.remembers():
            self._off_loop = object()
            self.done.later(LOOK_S, self._look_off_loop, self._off_loop)

    def on_loop(self) -> None:
        """The channel is back: the loop's timer reads the marker again (``watch``)."""
        self._off_loop = None
        if self.done.remembers():
            self.watch()

    def _look_off_loop(self, run: object) -> None:
        """A read of ``off_loop``'s ``run`` on its own thread: a new birth's marks are posted
        from here (a store that fails is tried again at the next read)."""
        if run is not self._off_loop or self.store is None:
            return
        try:
            born_us = self.store.born_us()
            known = self._known_us
            if born_us is not None and known is not None and born_us != known:
                self._born_again(born_us, self.done.write_again_now(born_us))
            if born_us is not None:
                self._known_us = born_us
        except StoreError:
            pass
        self.done.later(LOOK_S, self._look_off_loop, run)

    def saw(self, born_us: int | None, *, claimed: bool = True) -> None:
        """A claim's answer (``claimed``), or a look, found ``born_us``."""
        if born_us is None:
            return
        if claimed:
            self.latest_us = born_us
        known, self._known_us = self._known_us, born_us
        if known is None or born_us == known:
            return
        self._born_again(born_us, self.done.write_again(born_us))

    def _born_again(self, born_us: int, written: int) -> None:
        logger.warning(
            "interval: the store was born again at %d (it lost its state): the done marks of "
            "%d task(s) that ran here go to it again; new starts wait %.0fs for the other "
            "workers' marks",
            born_us,
            written,
            MARKS_SETTLE_US / 1e6,
        )
