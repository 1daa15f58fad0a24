"""The pool as the slot cycle sees it: free processes, due tasks waiting, tasks handed over."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Any

from celery_interval.worker.held import Held, HeldState
from celery_interval.worker.timer import cancel

__all__ = ["POOL_POLL_S", "Pool"]

#: How often a due task re-checks for a free pool process (seconds).
POOL_POLL_S = 0.001


class Pool:
    """Due tasks wait here, lowest ticket first, for a free pool process; tasks handed to the
    pool are counted until their end, and kept until a process accepts them.

    ``accepted`` runs on a threads pool's executor thread, the rest on the event loop's: the
    tasks handed over and their count change under one lock, so that each is either accepted
    or taken for orphaned, never both unseen."""

    def __init__(self, timer: Any, free: Callable[[], int], claim: Callable[[Held], None]) -> None:
        self.timer = timer
        #: Pool processes that can start a task now.
        self.free = free
        self._claim = claim
        #: Due tasks waiting for a pool process: a heap by (ticket, bucket, arrival).
        self.waiting: list[tuple[int, str, int, Held]] = []
        self._waiting_seq = itertools.count()
        self._poll_entry: Any = None
        #: Tasks handed to the pool whose end was not reported yet.
        self.in_pool = 0
        #: Tasks handed to the pool that no process accepted yet, by request id.
        self.released: dict[str, Held] = {}
        #: Tasks taken for orphaned (``take_unaccepted``) that a process may still accept.
        self._orphaned: dict[str, Held] = {}
        self._lock = threading.Lock()

    def wait(self, held: Held) -> None:
        """Queue a due task behind those already waiting for a pool process; one poll for all
        of them (a task whose timer fires as the pool frees must not jump the queue)."""
        held.state = HeldState.WAITING_POOL
        entry = (held.ticket, held.bucket, next(self._waiting_seq), held)
        heapq.heappush(self.waiting, entry)
        self._ensure_poll()

    def _ensure_poll(self) -> None:
        if self._poll_entry is None:
            self._poll_entry = self.timer.call_after(POOL_POLL_S, self._poll, priority=6)

    def _poll(self) -> None:
        """Claim waiting tasks lowest ticket first while pool processes are free: a worker
        that claimed in timer order would pass its own earlier tickets (they re-ticket)."""
        self._poll_entry = None
        while self.waiting and self.free() > 0:
            held = heapq.heappop(self.waiting)[-1]
            if held.state is not HeldState.WAITING_POOL:
                continue
            held.state = HeldState.GRANTED
            self._claim(held)
        if self.waiting:
            self._ensure_poll()

    def handed(self, held: Held) -> None:
        """``held`` goes to the pool: it counts as running until its end is reported."""
        with self._lock:
            self.in_pool += 1
            self.released[held.request.id] = held

    def accepted(self, task_id: str) -> Held | None:
        """A pool process accepted the task: it runs (its end calls ``freed``). The task, if
        it had been taken for orphaned (a threads pool runs what it was given after the channel
        closed): it counts as running again, and the caller renews its lease again."""
        with self._lock:
            if self.released.pop(task_id, None) is not None:
                return None
            late = self._orphaned.pop(task_id, None)
            if late is not None:
                self.in_pool += 1
            return late

    def freed(self) -> None:
        """A pool process finished a task."""
        with self._lock:
            self.in_pool -= 1

    def take_unaccepted(self) -> list[Held]:
        """The tasks handed over that no process accepted, which the pool drops when the
        channel closes and whose end it never reports: they no longer count as running."""
        with self._lock:
            orphans, self.released = list(self.released.values()), {}
            self.in_pool -= len(orphans)
            self._orphaned.update((held.request.id, held) for held in orphans)
        return orphans

    def clear(self) -> None:
        """The connection is gone: no task waits for a process any more."""
        if self._poll_entry is not None:
            cancel(self.timer, self._poll_entry)
        self._poll_entry = None
        self.waiting.clear()
