"""Done marks: acknowledged messages reported to the store in batches, off the critical path."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from celery_interval.config import Settings
from celery_interval.errors import StoreError
from celery_interval.schedule import Done, Granted, Lease, Mark
from celery_interval.stores.base import Store, TaskCopy
from celery_interval.worker.store.outage import StoreOutage
from celery_interval.worker.timer import cancel

__all__ = ["DoneMarks"]

#: Done marks go on the event loop's next turn (a take in this one carries them): a worker
#: killed before its marks reach the store leaves copies that run again once the lease ends.
DONE_FLUSH_S = 0.0
#: Copies remembered as begun here (``DoneMarks.began``): at most this many, each for the
#: dedupe window.
BEGAN_KEPT = 20_000

#: The marks of tasks released to the pool but never reported are read again this often
#: (seconds) after the read as the channel closes, until a lease and ``ORPHAN_READS_PAST_S``
#: later: a process held in a claim (a pause, a settle window) may begin one late, and a store
#: that loses its state soon after would take the mark before a sparser read found it.
ORPHAN_READ_EVERY_S = 0.25
ORPHAN_READS_PAST_S = 1.25
#: Runs ``fn(*args)`` after ``delay_s`` seconds on a thread of its own.
Later = Callable[..., None]


def on_a_thread(delay_s: float, fn: Callable[..., None], *args: Any) -> None:
    """``Later`` by a daemon ``threading.Timer``: it runs while the event loop does not."""
    thread = threading.Timer(delay_s, fn, args)
    thread.daemon = True
    thread.start()


class DoneMarks:
    """The done marks not yet sent: flushed on the loop's next turn, or carried by a take."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        timer: Any,
        outage: StoreOutage,
        later: Later = on_a_thread,
    ) -> None:
        self.settings = settings
        self.store = store
        self.timer = timer
        self.outage = outage
        self.pending: list[TaskCopy] = []
        self._entry: Any = None
        #: Copies whose bodies began here, oldest first: when each is forgotten (monotonic
        #: seconds), and whether its body ended (not throttled: its mark may be written again).
        self._began: OrderedDict[TaskCopy, tuple[float, bool]] = OrderedDict()
        #: Copies whose bodies ran on when the store was born again: marked as they end.
        self._owed: set[TaskCopy] = set()
        #: The store's birth (its clock, µs) for which the marks were last written again.
        self._born_us: int | None = None
        #: When (monotonic s) the marks were last written again.
        self._rewritten_s = float("-inf")
        self._later = later
        #: Copies whose marks a read on another thread found, with when it read them.
        self._found: deque[tuple[TaskCopy, float]] = deque()
        #: Bodies whose pool processes posted their marks and whose acks wait for their ends
        #: (their processes reached them late), by task id: a broken channel returns them.
        self.acks_waiting: dict[str, TaskCopy] = {}

    def began(self, copy: TaskCopy, *, ended: bool = False, start_us: int | None = None) -> None:
        """``copy``'s body began here and its message was acknowledged: a copy of it that the
        broker hands back here is a duplicate even where the store has no done mark (the store
        lost its state, and a broker killed as the ack came lost the ack). A body admitted
        (``start_us``, the store's clock) before the birth whose marks were written again
        posted its mark to the store that was lost: it goes again, now or as the body ends."""
        now_s = time.monotonic()
        self._began.pop(copy, None)
        self._began[copy] = (now_s + self.settings.dedupe_ttl_us / 1e6, ended)
        if start_us is not None and self._born_us is not None and start_us < self._born_us:
            if ended:
                self.add(copy.bucket, copy.task_id, copy.retries)
            else:
                self._owed.add(copy)
        while self._began and (
            len(self._began) > BEGAN_KEPT or next(iter(self._began.values()))[0] <= now_s
        ):
            self._owed.discard(self._began.popitem(last=False)[0])

    def ended(self, copy: TaskCopy) -> None:
        """``copy``'s body, which ``began`` here, ended (and was not throttled); its mark goes
        again if the store was born again while it ran (``write_again``)."""
        kept = self._began.get(copy)
        if kept is not None:
            self._began[copy] = (kept[0], True)
        if copy in self._owed:
            self._owed.discard(copy)
            self.add(copy.bucket, copy.task_id, copy.retries)

    def acks_wait(self, task_id: Any, copy: TaskCopy) -> None:
        """``copy``'s body runs, its mark posted by its process, its ack at its end."""
        if isinstance(task_id, str):
            self.acks_waiting[task_id] = copy

    def ack_went(self, task_id: Any) -> TaskCopy | None:
        """The body of ``task_id`` ended: its ack goes (``acks_wait``). Returns its copy."""
        return self.acks_waiting.pop(task_id, None) if isinstance(task_id, str) else None

    def forget(self, copy: TaskCopy) -> None:
        """``copy``'s body ended in a throttle whose copy went again as a plain message: that
        copy must run, here too (the store, not this memory, keeps it from running twice)."""
        self._began.pop(copy, None)
        self._owed.discard(copy)

    def look_for_marks(
        self, copies: list[TaskCopy], gaps_s: tuple[float, ...] | None = None
    ) -> None:
        """Tasks released to the pool but never reported (the channel closed): a process may
        have begun one and posted its mark, now or soon after. A read now, and after each of
        ``gaps_s`` (seconds, one after another; by default every ``ORPHAN_READ_EVERY_S`` until
        a lease and ``ORPHAN_READS_PAST_S`` later), that finds the mark remembers the copy as
        begun and ended here, so its mark goes again if the store is born again and a copy
        handed back here is dropped. The later reads run on a thread of their own: Celery runs
        no timer while it reconnects to the broker, and a store that loses its state meanwhile
        would take marks readable before."""
        if gaps_s is None:
            last_s = self.settings.lease_us / 1e6 + ORPHAN_READS_PAST_S
            gaps_s = (ORPHAN_READ_EVERY_S,) * math.ceil(last_s / ORPHAN_READ_EVERY_S)
        left = [copy for copy in copies if not self.marked(copy)]
        for copy in copies:
            if copy not in left:
                self.began(copy, ended=True)
        if left and gaps_s:
            self._later(gaps_s[0], self._read_later, left, gaps_s[1:])

    def _read_later(self, copies: list[TaskCopy], gaps_s: tuple[float, ...]) -> None:
        """``look_for_marks``'s later reads (on their own thread): what they find waits in
        ``_found`` for the loop thread (``_take_found``)."""
        left = []
        for copy in copies:
            if self.marked(copy):
                self._found.append((copy, time.monotonic()))
            else:
                left.append(copy)
        if left and gaps_s:
            self._later(gaps_s[0], self._read_later, left, gaps_s[1:])

    def _take_found(self) -> None:
        """Remember the copies the later reads found; a mark read before the marks were last
        written again (a birth came meanwhile) goes again now."""
        while self._found:
            copy, read_s = self._found.popleft()
            self.began(copy, ended=True)
            if read_s < self._rewritten_s:
                self.add(copy.bucket, copy.task_id, copy.retries)

    def marked(self, copy: TaskCopy) -> bool:
        """Whether the store holds ``copy``'s done mark now (False if it cannot say: a store
        without reads, or one that fails)."""
        return isinstance(self._mark(copy), Done)

    def _mark(self, copy: TaskCopy) -> Mark | None:
        """``copy``'s mark in the store now (None if it cannot say)."""
        read = getattr(self.store, "read_mark", None)
        if read is None:
            return None
        try:
            mark: Mark | None = read(copy.bucket, copy.task_id, copy.retries)
        except StoreError:
            return None
        return mark

    def remembers(self) -> bool:
        """Whether any body that began here is remembered (its mark may have to go again)."""
        self._take_found()
        return bool(self._began)

    def began_here(self, copy: TaskCopy) -> bool:
        """Whether ``copy``'s body began here within the dedupe window (``began``)."""
        self._take_found()
        kept = self._began.get(copy)
        return kept is not None and kept[0] > time.monotonic()

    def again_if_ended(self, copy: TaskCopy) -> None:
        """A copy of what began here came back with no mark in the store: the mark goes again
        only if that body ended here. A throttled run's entry never ends (its copy sent again
        must run: a mark now would drop it as done), a running body posts its own; nor while
        the store holds the task's lease or kept place (a body released as the channel broke,
        remembered by its mark, may have been throttled since: its copy sent again runs)."""
        self._take_found()
        kept = self._began.get(copy)
        if kept is not None and kept[1] and kept[0] > time.monotonic() and not self._runs(copy):
            self.add(copy.bucket, copy.task_id, copy.retries)

    def _runs(self, copy: TaskCopy) -> bool:
        """Whether the store holds a lease or a throttled copy's kept place for ``copy``."""
        mark = self._mark(copy)
        return isinstance(mark, Lease) or (isinstance(mark, Granted) and mark.front)

    def write_again(self, born_us: int) -> int:
        """The store lost its state (born again at ``born_us``): the done marks of the bodies
        that ran here go again with the next flush (not a throttled run's: its copy sent again
        must run), and those of the bodies still running go as each ends (not now: a pool
        process that claims again must not meet its own mark). Returns how many go now."""
        self._take_found()
        self._born_us = born_us
        now_s = self._rewritten_s = time.monotonic()
        live = [(c, ended) for c, (forget_s, ended) in self._began.items() if forget_s > now_s]
        again = [c for c, ended in live if ended]
        self._owed.update(c for c, ended in live if not ended)
        self.pending.extend(again)
        if again:  # at once, not after an outage's backoff
            if self._entry is not None:
                cancel(self.timer, self._entry)
            self._entry = self.timer.call_after(DONE_FLUSH_S, self.flush, priority=8)
        return len(again)

    def write_again_now(self, born_us: int) -> int:
        """``write_again`` from a thread of its own while the loop does not run (its channel
        lost): the ended bodies' marks are posted from here at once (``StoreError`` if they
        do not go: nothing is recorded, the caller tries again). Returns how many went."""
        while True:
            try:
                kept = list(self._began.items())
                break
            except RuntimeError:  # a threads pool's callback changed it meanwhile
                continue
        now_s = time.monotonic()
        live = [(c, ended) for c, (forget_s, ended) in kept if forget_s > now_s]
        again = [c for c, ended in live if ended]
        found = {c for c, _ in list(self._found)} - set(again)  # the loop takes them later
        again.extend(found)
        if again:
            self.store.done(again, self.settings.dedupe_ttl_us)
        self._born_us, self._rewritten_s = born_us, now_s
        self._owed.update(c for c, ended in live if not ended and c not in found)
        return len(again)

    def later(self, delay_s: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` after ``delay_s`` on a thread of its own (``Later``)."""
        self._later(delay_s, fn, *args)

    def add(self, bucket: str, task_id: str, retries: int) -> None:
        """Send this message's mark on the event loop's next turn (or with a take in this one)."""
        self.pending.append(TaskCopy(bucket, task_id, retries))
        if self._entry is None:
            self._entry = self.timer.call_after(DONE_FLUSH_S, self.flush, priority=8)

    def take(self) -> list[TaskCopy]:
        """The pending marks, for a store call that carries them (``put_back`` if it fails)."""
        marks, self.pending = self.pending, []
        return marks

    def put_back(self, marks: list[TaskCopy]) -> None:
        """Marks a failed store call carried: they go with the next flush."""
        self.pending = marks + self.pending

    def flush(self) -> None:
        """Send pending done marks in one pipeline; retried with backoff while the store is out."""
        self._entry = None
        batch, self.pending = self.pending, []
        if not batch:
            return
        try:
            self.store.done(batch, self.settings.dedupe_ttl_us)
        except StoreError as exc:
            self.outage.failed(exc)
            self.pending = batch + self.pending
            self._entry = self.timer.call_after(self.outage.backoff_s, self.flush, priority=8)
            return
        self.outage.answered()
