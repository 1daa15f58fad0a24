"""Map store-clock times onto this host's monotonic clock from round-trip samples."""

from __future__ import annotations

import collections

__all__ = ["StoreClock", "local_ns"]


def local_ns(
    store_us: int, sent_ns: int, received_ns: int, ahead_us: int, offset_ns: int | None
) -> int:
    """The monotonic time of ``store_us``, which the store saw ``ahead_us`` in its future during
    the round trip ``[sent_ns, received_ns]``, by the store clock's ``offset_ns`` from this
    host's monotonic one, clamped into that trip (None: no estimate, the trip's latest)."""
    earliest_ns = sent_ns + ahead_us * 1000
    latest_ns = received_ns + ahead_us * 1000
    if offset_ns is None:
        return latest_ns
    return min(max(store_us * 1000 - offset_ns, earliest_ns), latest_ns)


class StoreClock:
    """NTP-style offset estimate: the recent sample with the shortest round trip wins.

    A store time ``t`` was read somewhere inside ``[sent_ns, received_ns]``; of the recent
    samples, the one with the shortest round trip bounds the offset best. Every mapped time is
    clamped into its own round trip's window, so a stale estimate (a store clock step, drift)
    is never off by more than that round trip.
    """

    def __init__(self, window: int = 64) -> None:
        self._samples: collections.deque[tuple[int, int]] = collections.deque(maxlen=window)
        #: ``min(self._samples)``, kept as samples come and go (it is read on every start).
        self._best: tuple[int, int] | None = None

    def observe(self, store_now_us: int, sent_ns: int, received_ns: int) -> None:
        """Record that the store read ``store_now_us`` during this round trip."""
        rtt_ns = received_ns - sent_ns
        sample = (rtt_ns, store_now_us * 1000 - (sent_ns + rtt_ns // 2))
        samples = self._samples
        evicted = samples[0] if len(samples) == samples.maxlen else None
        samples.append(sample)
        if self._best is None or sample < self._best:
            self._best = sample
        elif evicted == self._best:
            self._best = min(samples)

    def one_way_us(self) -> int:
        """Half the best recent round trip (0 before any sample): how long a reply takes."""
        return 0 if self._best is None else self._best[0] // 2000

    def offset_ns(self) -> int | None:
        """The store clock minus this host's monotonic one (ns) by the best recent sample."""
        return None if self._best is None else self._best[1]

    def local_ns(self, store_us: int, sent_ns: int, received_ns: int, ahead_us: int) -> int:
        """The monotonic time of ``store_us``, which the store saw ``ahead_us`` in its future."""
        return local_ns(store_us, sent_ns, received_ns, ahead_us, self.offset_ns())
