"""Each key's place in its fair outer bucket's share now, for status, inspect and the exporter."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from celery_interval.config import Settings
from celery_interval.errors import ConfigurationError, StoreError
from celery_interval.ledger import reader_for_app
from celery_interval.schedule.fair import FairShare
from celery_interval.starts import happened

__all__ = [
    "RATE_WINDOW_S",
    "KeyShare",
    "achieved_rates",
    "fair_shares",
    "key_shares",
    "with_shares",
]

#: The window a key's achieved rate is counted over, in seconds.
RATE_WINDOW_S = 10.0


@dataclass(frozen=True)
class KeyShare:
    """A nested bucket's place in its fair outer's share: the outer, the key's weight, the
    fraction of the outer's starts due to it now (0: it has no work waiting), and whether it
    waits for a start."""

    outer: str
    weight: int
    share: float
    waiting: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "outer": self.outer,
            "weight": self.weight,
            "share": round(self.share, 4),
            "waiting": self.waiting,
        }


def key_shares(outer: str, share: FairShare, now_us: int) -> dict[str, KeyShare]:
    """Each key the share knows, by name: its weight, and its fraction of the outer's starts
    among the keys waiting at ``now_us`` (the store's clock)."""
    waiting = {tag.key for tag in share.tags if tag.want_until_us >= now_us}
    total = sum(tag.weight for tag in share.tags if tag.key in waiting)
    return {
        tag.key: KeyShare(
            outer, tag.weight, tag.weight / total if tag.key in waiting else 0.0, tag.key in waiting
        )
        for tag in share.tags
    }


def fair_shares(settings: Settings, store: Any, buckets: Iterable[str]) -> dict[str, KeyShare]:
    """The place of each of ``buckets`` nested in a fair outer bucket (one read of ``store``
    per outer); a key its outer's share does not know yet has its weight and no share. The
    others are left out."""
    nested = {b: o for b in buckets if (o := settings.outer_of(b)) is not None and o.weight}
    if not nested:
        return {}
    read = getattr(store, "read_fair", None)
    if read is None:
        return {}
    known: dict[str, KeyShare] = {}
    for outer in sorted({o.bucket for o in nested.values()}):
        share, now_us = read(outer)
        known.update(key_shares(outer, share, now_us))
    return {
        bucket: known.get(bucket) or KeyShare(outer.bucket, outer.weight or 1, 0.0, False)
        for bucket, outer in nested.items()
    }


def with_shares(settings: Settings, store: Any, rows: dict[str, dict[str, Any]]) -> None:
    """Add ``fair`` (``KeyShare.as_dict``) to each row of a bucket nested in a fair outer; a
    store that cannot be read adds ``fair_error`` to each such row instead."""
    try:
        found = fair_shares(settings, store, rows)
    except (StoreError, ConfigurationError) as exc:
        for bucket in rows:
            outer = settings.outer_of(bucket)
            if outer is not None and outer.weight:
                rows[bucket]["fair_error"] = str(exc)
        return
    for bucket, share in found.items():
        rows[bucket]["fair"] = share.as_dict()


def achieved_rates(
    app: Any, buckets: list[str], window_s: float = RATE_WINDOW_S
) -> dict[str, float]:
    """Each bucket's starts a second over the last ``window_s`` (its ledger, the store's
    clock); empty where the store keeps no ledger."""
    try:
        reader = reader_for_app(app)
    except ConfigurationError:
        return {}
    try:
        since_us = reader.now_us() - round(window_s * 1e6)
        return {b: len(happened(reader.entries(b, since_us=since_us))) / window_s for b in buckets}
    finally:
        reader.close()
