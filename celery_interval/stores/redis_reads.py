"""RedisReads: a RedisStore's plain reads beside its scripts (a ledger page, raw records)."""

from __future__ import annotations

from typing import Any

from celery_interval.errors import StoreError
from celery_interval.schedule import BucketState, Mark, Place, Places
from celery_interval.schedule.fair import FairShare
from celery_interval.stores import keys
from celery_interval.stores.codec import as_text, decode_fair, decode_mark
from celery_interval.stores.redis_calls import ScriptCalls
from celery_interval.stores.redis_link import RedisLink
from celery_interval.stores.tats import decode_tats

__all__ = ["LEDGER_TTL_MS", "RedisReads"]

#: A bucket's ledger expires this long after its last entry (lib.lua's LEDGER_TTL_MS): an idle
#: tenant's audit goes a week after its last task; export it before (``interval ledger export``).
LEDGER_TTL_MS = 7 * 24 * 3600 * 1000


class RedisReads:
    """A RedisStore's ``ledger`` and ``read_*`` diagnostics, for tests, ``status`` and
    debugging (not atomic with each other): the keys ``calls`` builds, read with the client of
    ``link`` and its errors raised as the store's."""

    def __init__(self, calls: ScriptCalls, link: RedisLink) -> None:
        self._calls = calls
        self._link = link

    # -- the ledger ---------------------------------------------------------------------

    def ledger(
        self, bucket: str, start_id: str = "-", count: int = 1000
    ) -> list[tuple[str, dict[str, str]]]:
        """One page of ``bucket``'s ledger, oldest first: ``(entry_id, fields)`` decoded to str.

        ``start_id`` is inclusive; pass ``"(" + last_id`` (Redis >= 6.2) for the next page.
        Fields: ``op`` and ``now`` (store real µs) always, the rest depend on ``op`` (see the
        headers of the Lua scripts). An empty list means no (more) entries.
        """
        with self._link.errors("ledger"):
            raw: Any = self._link.client().xrange(
                self._calls.ledger_key(bucket), min=start_id, count=count
            )
        return [
            (as_text(entry_id), {as_text(k): as_text(v) for k, v in fields.items()})
            for entry_id, fields in raw
        ]

    # -- diagnostics (plain reads, not atomic with each other) --------------------------

    def read_state(self, bucket: str) -> BucketState | None:
        """The bucket's raw state record, or None; for tests, ``status`` and debugging."""
        with self._link.errors("read_state"):
            raw: dict[Any, Any] = self._link.client().hgetall(self._calls.state_key(bucket))
        # m: the replication id of the master that saved it (a fenced store), not a number
        f = {as_text(k): v for k, v in raw.items() if as_text(k) != "m"}
        if "e" not in f:  # no record, or only a reset's
            return None
        limit_tats = decode_tats(as_text(f.pop("x", b"")))
        f = {k: int(v) for k, v in f.items()}
        try:
            return BucketState(
                epoch=f["e"],
                offset_us=f["o"],
                paused_at_real_us=f.get("p"),
                tat_us=f["t"],
                ticket=f["n"],
                current_slot_us=f["c"],
                last_start_us=f["l"],
                interval_override_us=f.get("i"),
                reserved_us=f.get("h"),
                adapted_us=f.get("a"),
                clean_starts=f.get("k", 0),
                start_extra_us=f.get("q", 0),
                last_slot_us=f.get("g"),
                lost_start_us=f.get("z"),
                limit_tats=limit_tats,
                front_tat_us=f.get("f"),
                pushed_us=f.get("u", 0),
                throttled_until_us=f.get("w"),
                admitted=f.get("s", 0),
            )
        except KeyError as exc:
            raise StoreError(f"interval state of bucket {bucket!r} lacks field {exc}") from None

    def read_places(self, bucket: str) -> Places:
        """The bucket's places as stored (expired ones until a script drops them)."""
        with self._link.errors("read_places"):
            raw: Any = self._link.client().zrange(
                self._calls.places_key(bucket), 0, -1, withscores=True
            )
        return tuple(Place(int(score), as_text(name)) for name, score in raw)

    def read_fair(self, outer: str) -> tuple[FairShare, int]:
        """An outer bucket's fair share as stored (empty: none; fair.lua's hash), and the
        store's clock (µs) as it was read."""
        with self._link.errors("read_fair"):
            key = keys.fair_key(self._calls.prefix, keys.validate_bucket(outer))
            client = self._link.client()
            raw: dict[Any, Any] = client.hgetall(key)
            clock = self._calls.clock_arg()
            now_us = int(clock) if clock else _time_us(client.time())
        return decode_fair({as_text(k): as_text(v) for k, v in raw.items()}), now_us

    def born_us(self) -> int | None:
        """The birth marker as it stands (None: not written yet, or a Cluster's: none)."""
        keys = self._calls.born_keys()
        if not keys:
            return None
        with self._link.errors("born_us"):
            raw: Any = self._link.client().get(keys[0])
        return None if raw is None else int(raw)

    def read_mark(self, bucket: str, task_id: str, retries: int) -> Mark | None:
        """The stored mark of (task_id, retries), expired or not, or None."""
        with self._link.errors("read_mark"):
            raw: Any = self._link.client().get(self._calls.mark_key(bucket, task_id, retries))
        return decode_mark(raw)


def _time_us(reply: Any) -> int:
    seconds, micros = reply
    return int(seconds) * 1_000_000 + int(micros)
