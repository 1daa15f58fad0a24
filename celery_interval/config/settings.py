"""Settings from ``app.conf`` (``interval_*``), validated once and cached per app."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from celery_interval.config.declarations import (
    Declaration,
    lookup,
    lookup_names,
    parse_queues,
    weight_of,
)
from celery_interval.config.intervals import MAX_INTERVAL_S, US_PER_S
from celery_interval.config.suggest import closest
from celery_interval.config.table import DEFAULTS, MOVED
from celery_interval.config.values import check_int, check_seconds
from celery_interval.errors import ConfigurationError, UnknownBucket, short_repr
from celery_interval.schedule import MAX_LEAD_US, Limits
from celery_interval.schedule.outer import Outer
from celery_interval.stores.urls import is_redis_broker_url

__all__ = ["Settings", "forget", "settings_of"]

_V = TypeVar("_V")


@dataclass(frozen=True)
class Settings:
    """The validated ``interval_*`` settings of one app; durations in integer µs. A per-bucket
    method takes a task's own declaration (``own``, its ``interval`` option), whose fields win."""

    #: "" when unset and the broker is not Redis: a producer sends without one; a store
    #: (``store``) refuses it (``require_store_url``).
    store_url: str
    #: ``interval_queues``: queue, ``'queue:*'`` or ``queue:key`` → its declaration.
    declarations: Mapping[str, Declaration]
    key_prefix: str
    max_held: int
    max_ahead_s: float
    hold_ahead_s: float
    max_held_total: int
    overflow: bool
    ledger_max: int
    lease_us: int
    lead_us: int
    handoff_us: int
    dedupe_ttl_us: int
    store_timeout_s: float
    pause_poll_s: float
    retry_max_s: float
    broker_timeout_s: float | None

    def _field(
        self,
        bucket: str,
        read: Callable[[Declaration], _V | None],
        own: Declaration | None = None,
        *,
        to_queue: bool = True,
    ) -> _V | None:
        """``own``'s field, else the bucket's declared one (``declarations.lookup``)."""
        mine = None if own is None else read(own)
        if mine is not None:
            return mine
        return lookup(self.declarations, bucket, read, to_queue=to_queue)

    def interval_us(self, bucket: str, own: Declaration | None = None) -> int:
        """The declared interval of ``bucket``; ``UnknownBucket`` when none is declared."""
        interval_us = self._field(bucket, lambda d: d.interval_us, own)
        if interval_us is None:
            known = ", ".join(self.buckets()) or "none"
            raise UnknownBucket(f"unknown interval bucket {bucket!r}; configured: {known}")
        return interval_us

    def require_store_url(self) -> str:
        """The store URL; ``ConfigurationError`` when it is not set and the broker is not Redis."""
        if not self.store_url:
            raise ConfigurationError(
                "interval_store_url is not set (and the broker is not Redis): "
                "set it to redis://host:6379/0, rediss://…, file:///shared/dir or memory://"
            )
        return self.store_url

    def has_interval(self, bucket: str) -> bool:
        """Whether ``bucket`` has a declared interval (its own, a pattern's or its queue's)."""
        return self._field(bucket, lambda d: d.interval_us) is not None

    def burst_of(self, bucket: str, own: Declaration | None = None) -> int:
        """The burst of ``bucket``; 1: none."""
        return self._field(bucket, lambda d: d.burst, own) or 1

    def limits_of(self, bucket: str, own: Declaration | None = None) -> Limits:
        """The extra limits of ``bucket``; (): none."""
        return self._field(bucket, lambda d: d.limits, own) or ()

    def concurrency_of(self, bucket: str, own: Declaration | None = None) -> int | None:
        """The cap of ``bucket``; None: uncapped."""
        return self._field(bucket, lambda d: d.concurrency, own)

    def share_of(self, bucket: str) -> float | None:
        """The interactive share of ``bucket``; None: its ``slot()`` callers queue behind the
        tickets as tasks do."""
        return self._field(bucket, lambda d: d.interactive_share)

    def adapt_max_us(
        self, bucket: str, interval_us: int, own: Declaration | None = None
    ) -> int | None:
        """The slowest interval ``bucket`` may adapt to; None: not adaptive."""
        adaptive = self._field(bucket, lambda d: d.adaptive, own)
        if adaptive is None or adaptive is False:
            return None
        if adaptive is True:
            return min(100 * interval_us, MAX_INTERVAL_S * US_PER_S)
        return max(adaptive, interval_us)

    def outer_name(self, bucket: str) -> str | None:
        """The outer bucket's name: from ``bucket``'s own entry or its ``'queue:*'`` entry,
        never its queue's; None: not nested (a bucket is never its own outer)."""
        name = self._field(bucket, lambda d: d.outer, to_queue=False)
        return None if name == bucket else name

    def outer_of(self, bucket: str) -> Outer | None:
        """The outer bucket ``bucket`` is nested in, with its interval, burst and limits;
        None: not nested."""
        name = self.outer_name(bucket)
        if name is None:
            return None
        weight = self.weight_of(bucket) if self.is_fair(name) else None
        return Outer(
            name, self.interval_us(name), self.burst_of(name), self.limits_of(name), weight
        )

    def pace_us(self, bucket: str, interval_us: int) -> int:
        """The least spacing of ``bucket``'s starts: its interval, or its outer bucket's if
        longer (every start counts in both)."""
        name = self.outer_name(bucket)
        return interval_us if name is None else max(interval_us, self.interval_us(name))

    def is_fair(self, bucket: str) -> bool:
        """Whether ``bucket``'s starts are divided among its nested buckets by weight."""
        return bool(self._field(bucket, lambda d: d.fair, to_queue=False))

    def weight_of(self, bucket: str) -> int:
        """``bucket``'s weight in its outer's fair share (its own entry, else its
        ``'queue:*'`` entry's; 1: none declared)."""
        for name in lookup_names(bucket, to_queue=False):
            entry = self.declarations.get(name)
            said = f"interval_queues[{name!r}]['weight']"
            weight = None if entry is None else weight_of(entry, bucket, said)
            if weight is not None:
                return weight
        return 1

    @property
    def nested(self) -> bool:
        """Whether any bucket is declared nested in an outer bucket."""
        return any(d.outer is not None for d in self.declarations.values())

    def buckets(self) -> list[str]:
        """Every bucket declared by name in ``interval_queues`` (not the ``'queue:*'`` ones)."""
        return sorted(name for name in self.declarations if not name.endswith(":*"))

    @property
    def queues_us(self) -> dict[str, int]:
        """Each bucket declared by name → its interval."""
        return {name: self.interval_us(name) for name in self.buckets()}


_cache: weakref.WeakKeyDictionary[Any, Settings] = weakref.WeakKeyDictionary()


def settings_of(app: Any) -> Settings:
    """The app's validated settings; bad values raise ``ConfigurationError`` naming the key."""
    cached = _cache.get(app)
    if cached is None:
        cached = _load(app.conf)
        _cache[app] = cached
    return cached


def forget(app: Any) -> None:
    """Drop the cached settings (after ``app.conf`` changed)."""
    _cache.pop(app, None)


def _get(conf: Any, key: str) -> Any:
    value = conf.get(key)
    return DEFAULTS[key] if value is None else value


def _seconds(conf: Any, key: str, *, allow_zero: bool = False) -> float:
    return check_seconds(_get(conf, key), key, allow_zero=allow_zero)


def _check_keys(conf: Any) -> None:
    """Refuse a moved setting (saying where it went) and an unknown ``interval_*`` key (with
    the closest setting). Only ``interval_*`` keys are looked at: the rest are Celery's."""
    for key in sorted(k for k in list(conf) if isinstance(k, str) and k.startswith("interval_")):
        if key in DEFAULTS or conf.get(key) is None:
            continue
        if key in MOVED:
            field, example = MOVED[key]
            raise ConfigurationError(
                f"{key} is no longer a setting: declare the {field} in interval_queues, e.g. "
                f"{{'api': {{'interval': '10/s', '{field}': {example}}}}}"
            )
        near = closest(key.removeprefix("interval_"), [k[len("interval_") :] for k in DEFAULTS])
        hint = "" if near is None else f"; did you mean 'interval_{near}'?"
        raise ConfigurationError(f"{key}={short_repr(conf.get(key))}: not a setting{hint}")


def _load(conf: Any) -> Settings:
    _check_keys(conf)
    declarations = parse_queues(_get(conf, "interval_queues"))
    overflow = _get(conf, "interval_overflow")
    if not isinstance(overflow, bool):
        raise ConfigurationError(f"interval_overflow={overflow!r}: expected True or False")
    broker_timeout = conf.get("interval_broker_timeout_s")
    return Settings(
        store_url=_store_url(conf),
        declarations=declarations,
        key_prefix=str(_get(conf, "interval_key_prefix")),
        max_held=check_int(_get(conf, "interval_max_held"), "interval_max_held", 1),
        max_ahead_s=_seconds(conf, "interval_max_ahead_s"),
        hold_ahead_s=_seconds(conf, "interval_hold_ahead_s"),
        max_held_total=check_int(
            _get(conf, "interval_max_held_total"), "interval_max_held_total", 1
        ),
        overflow=overflow,
        ledger_max=check_int(
            _get(conf, "interval_ledger_max"), "interval_ledger_max", 0, "0 turns it off"
        ),
        lease_us=round(_seconds(conf, "interval_lease_s") * US_PER_S),
        lead_us=_lead_us(conf, "interval_lead_s"),
        handoff_us=_lead_us(conf, "interval_handoff_s"),
        dedupe_ttl_us=round(_seconds(conf, "interval_dedupe_ttl_s") * US_PER_S),
        store_timeout_s=_seconds(conf, "interval_store_timeout_s"),
        pause_poll_s=_seconds(conf, "interval_pause_poll_s"),
        retry_max_s=_seconds(conf, "interval_retry_max_s"),
        broker_timeout_s=None
        if broker_timeout is None
        else _seconds(conf, "interval_broker_timeout_s"),
    )


def _lead_us(conf: Any, key: str) -> int:
    lead_us = round(_seconds(conf, key, allow_zero=True) * US_PER_S)
    if lead_us > MAX_LEAD_US:
        raise ConfigurationError(f"{key}={conf.get(key)!r}: at most {MAX_LEAD_US / 1e6}s")
    return lead_us


def _store_url(conf: Any) -> str:
    url = conf.get("interval_store_url")
    if url is not None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigurationError(
                f"interval_store_url={url!r}: expected a URL string such as "
                "redis://host:6379/0 (leave it unset to use a Redis broker)"
            )
        return url
    broker = conf.get("broker_url") or ""
    return broker if is_redis_broker_url(broker) else ""
