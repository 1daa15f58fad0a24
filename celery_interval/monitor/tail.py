"""Follows each bucket's ledger Stream from the last entry read, and notices entries that the
stream's cap trimmed before they were read."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisClusterException, RedisError

from celery_interval.ledger import LedgerReader, id_key
from celery_interval.monitor.pages import Page, PageAsk, group_by_node, read_pages, refresh_slots
from celery_interval.monitor.tally import BucketTally
from celery_interval.stores.codec import as_text

__all__ = ["BATCH_BUCKETS", "PAGE", "Cursor", "LedgerTail"]

#: Entries read per bucket per round trip.
PAGE = 1_000
#: Buckets read per round trip and node (one MULTI each: a bucket's page and stream info agree).
BATCH_BUCKETS = 100


@dataclass
class Cursor:
    """Where the tail is in one bucket's stream, and what it could not read."""

    #: The id of the last entry read (None: none yet).
    last_id: str | None = None
    #: Entries of the stream (by its ``entries-added`` count, Redis >= 7) read or known lost.
    accounted: int | None = None
    #: Times the stream's cap trimmed past the last entry read: entries may have been lost.
    gaps: int = 0
    #: Entries trimmed before they were read (counted exactly on Redis >= 7 only).
    lost: int = 0

    def account(self, read: int, info: dict[str, Any] | None) -> None:
        """Account for ``read`` entries just read after the cursor, given the stream's
        ``XINFO STREAM`` taken in the same transaction (None: the stream is gone)."""
        if info is None:
            return
        length = int(info.get("length") or 0)
        first = info.get("first-entry")
        first_id = as_text(first[0]) if first else None
        added = info.get("entries-added")
        trimmed_past = (
            self.last_id is not None
            and first_id is not None
            and id_key(first_id) > id_key(self.last_id)
        )
        if added is None:  # Redis < 7: a trim past the cursor may have lost entries
            self.gaps += bool(trimmed_past)
            return
        added = int(added)
        if self.accounted is None or added < self.accounted:
            # first look, or a stream made anew: what was trimmed before is history
            self.accounted = added - length + read
            return
        lost = (added - self.accounted) - length if trimmed_past else 0
        if lost > 0:
            self.gaps += 1
            self.lost += lost
        self.accounted += max(0, lost) + read


class LedgerTail:
    """The tallies of every followed bucket, brought up to date by ``poll``."""

    def __init__(self, reader: LedgerReader, page: int = PAGE, max_pages: int = 100) -> None:
        if page < 1 or max_pages < 1:
            raise ValueError(f"page={page!r}, max_pages={max_pages!r}: expected integers >= 1")
        self._reader = reader
        self._page = page
        self._max_pages = max_pages
        self.cursors: dict[str, Cursor] = {}
        self.tallies: dict[str, BucketTally] = {}

    def follow(self, buckets: Iterable[str]) -> None:
        """Follow ``buckets`` too, from the oldest entry their ledgers still hold."""
        for bucket in buckets:
            if bucket not in self.cursors:
                self.cursors[bucket] = Cursor()
                self.tallies[bucket] = BucketTally()

    def poll(self) -> int:
        """Read every followed ledger's new entries (up to ``max_pages`` pages per bucket, the
        rest next time) into the tallies; the number of entries read."""
        total = 0
        pending = sorted(self.cursors)
        for _ in range(self._max_pages):
            if not pending:
                break
            full: list[str] = []
            for bucket, count in zip(pending, self._read(pending)):
                total += count
                if count == self._page:
                    full.append(bucket)
            pending = full
        return total

    def _read(self, buckets: list[str]) -> list[int]:
        """One page of each bucket's stream with its info, each bucket in one transaction,
        ``BATCH_BUCKETS`` buckets of one node per round trip."""
        client = self._reader.client()
        stream_keys = [self._reader.ledger_key(bucket) for bucket in buckets]
        pages: list[Page | None] = [None] * len(buckets)
        with self._reader.guard("tail"):
            try:
                for node, on_node in group_by_node(client, stream_keys):
                    for start in range(0, len(on_node), BATCH_BUCKETS):
                        indexes = on_node[start : start + BATCH_BUCKETS]
                        asks = [
                            PageAsk(stream_keys[i], self._start(buckets[i]), self._page)
                            for i in indexes
                        ]
                        for i, page in zip(indexes, read_pages(node, asks)):
                            pages[i] = page
            except (RedisError, RedisClusterException):
                refresh_slots(client)
                raise
        counts = []
        for bucket, read in zip(buckets, pages):
            assert read is not None
            if isinstance(read.entries, Exception):
                raise read.entries
            cursor, tally = self.cursors[bucket], self.tallies[bucket]
            entries = [(as_text(entry_id), fields) for entry_id, fields in read.entries]
            cursor.account(len(entries), None if isinstance(read.info, Exception) else read.info)
            for entry_id, fields in entries:
                tally.feed({as_text(k): as_text(v) for k, v in fields.items()})
                cursor.last_id = entry_id
            counts.append(len(entries))
        return counts

    def _start(self, bucket: str) -> str:
        last = self.cursors[bucket].last_id
        return "-" if last is None else "(" + last
