"""Settings from ``app.conf`` (``interval_*``), validated once and cached per app."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from celery_interval.buckets import queue_of
from celery_interval.defaults import SETTINGS
from celery_interval.errors import ConfigurationError, UnknownBucket
from celery_interval.intervals import MAX_INTERVAL_S, US_PER_S, parse_interval_us
from celery_interval.limits_config import parse_limits
from celery_interval.outer_config import outer_name, parse_outer
from celery_interval.schedule import MAX_LEAD_US, Limits
from celery_interval.schedule.outer import Outer
from celery_interval.stores.urls import is_redis_broker_url

__all__ = ["DEFAULTS", "Settings", "check_cap", "check_units", "settings_of"]

#: Every setting's default, from the one table in ``defaults``.
DEFAULTS: dict[str, Any] = {setting.key: setting.default for setting in SETTINGS}


@dataclass(frozen=True)
class Settings:
    """The validated ``interval_*`` settings of one app; durations in integer µs."""

    store_url: str
    queues_us: Mapping[str, int]
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
    extra_buckets_us: dict[str, int] = field(default_factory=dict)
    #: Adaptive buckets (queues) → their slowest interval, or None for 100 times the configured.
    adaptive_max_us: Mapping[str, int | None] = field(default_factory=dict)
    #: Capped buckets (queues) → the most bodies that run at once (``interval_concurrency``).
    concurrency: Mapping[str, int] = field(default_factory=dict)
    #: Buckets (queues) → their burst: units that may start back to back (``interval_burst``).
    burst: Mapping[str, int] = field(default_factory=dict)
    #: Buckets (queues) → their extra limits beside the interval (``interval_limits``).
    limits: Mapping[str, Limits] = field(default_factory=dict)
    #: Inner buckets (or ``queue:*``) → the outer bucket whose budget they also spend
    #: (``interval_outer``).
    outer: Mapping[str, str] = field(default_factory=dict)
    #: Buckets (queues) → the share of their rate kept for ``slot()`` callers, in (0, 1)
    #: (``interval_interactive_share``).
    interactive_share: Mapping[str, float] = field(default_factory=dict)

    def concurrency_of(self, bucket: str) -> int | None:
        """The cap of ``bucket`` (``queue:key`` falls back to ``queue``); None: uncapped."""
        return _of(self.concurrency, bucket)

    def burst_of(self, bucket: str) -> int:
        """The burst of ``bucket`` (``queue:key`` falls back to ``queue``); 1: none."""
        burst = _of(self.burst, bucket)
        return 1 if burst is None else burst

    def share_of(self, bucket: str) -> float | None:
        """The interactive share of ``bucket`` (``queue:key`` falls back to ``queue``); None:
        its ``slot()`` callers queue behind the tickets as tasks do."""
        for name in (bucket, queue_of(bucket)):
            if name in self.interactive_share:
                return self.interactive_share[name]
        return None

    def limits_of(self, bucket: str) -> Limits:
        """The extra limits of ``bucket`` (``queue:key`` falls back to ``queue``); (): none."""
        for name in (bucket, queue_of(bucket)):
            if name in self.limits:
                return self.limits[name]
        return ()

    def outer_of(self, bucket: str) -> Outer | None:
        """The outer bucket ``bucket`` is nested in, with its interval, burst and limits
        (``interval_outer``); None: not nested."""
        name = outer_name(self.outer, bucket)
        if name is None:
            return None
        return Outer(name, self.interval_us(name), self.burst_of(name), self.limits_of(name))

    def interval_us(self, bucket: str) -> int:
        """The configured interval of ``bucket`` (``queue:key`` falls back to ``queue``)."""
        known = {**self.queues_us, **self.extra_buckets_us}
        if bucket in known:
            return known[bucket]
        base = queue_of(bucket)
        if base in known:
            return known[base]
        raise UnknownBucket(
            f"unknown interval bucket {bucket!r}; configured: {', '.join(sorted(known)) or 'none'}"
        )

    def adapt_max_us(self, bucket: str, interval_us: int) -> int | None:
        """The slowest interval ``bucket`` (or its queue) may adapt to; None: not adaptive."""
        for name in (bucket, queue_of(bucket)):
            if name in self.adaptive_max_us:
                slowest_us = self.adaptive_max_us[name]
                if slowest_us is None:
                    return min(100 * interval_us, MAX_INTERVAL_S * US_PER_S)
                return max(slowest_us, interval_us)
        return None

    def buckets(self) -> list[str]:
        """Every bucket configured by name (interval_queues and IntervalTask options)."""
        return sorted({*self.queues_us, *self.extra_buckets_us})


def _of(per_bucket: Mapping[str, int], bucket: str) -> int | None:
    """``bucket``'s entry in ``per_bucket``, else its queue's; None: neither has one."""
    for name in (bucket, queue_of(bucket)):
        if name in per_bucket:
            return per_bucket[name]
    return None


#: A per-bucket setting's value type.
_V = TypeVar("_V")

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
    value = _get(conf, key)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"{key}={value!r}: expected a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigurationError(f"{key}={value!r}: expected a finite number of seconds > 0")
    return seconds


def _load(conf: Any) -> Settings:
    queues = _get(conf, "interval_queues")
    if not isinstance(queues, Mapping):
        raise ConfigurationError(
            f"interval_queues={queues!r}: expected a mapping of queue name to interval"
        )
    queues_us = {}
    for name, value in queues.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"interval_queues key {name!r}: expected a non-empty name")
        queues_us[name] = parse_interval_us(value, name=f"interval_queues[{name!r}]")
    ledger_max = _get(conf, "interval_ledger_max")
    if isinstance(ledger_max, bool) or not isinstance(ledger_max, int) or ledger_max < 0:
        raise ConfigurationError(
            f"interval_ledger_max={ledger_max!r}: expected an integer >= 0 (0 turns it off)"
        )
    max_held = _get(conf, "interval_max_held")
    if isinstance(max_held, bool) or not isinstance(max_held, int) or max_held < 1:
        raise ConfigurationError(f"interval_max_held={max_held!r}: expected an integer >= 1")
    max_held_total = _get(conf, "interval_max_held_total")
    if (
        isinstance(max_held_total, bool)
        or not isinstance(max_held_total, int)
        or max_held_total < 1
    ):
        raise ConfigurationError(
            f"interval_max_held_total={max_held_total!r}: expected an integer >= 1"
        )
    overflow = _get(conf, "interval_overflow")
    if not isinstance(overflow, bool):
        raise ConfigurationError(f"interval_overflow={overflow!r}: expected True or False")
    broker_timeout = conf.get("interval_broker_timeout_s")
    return Settings(
        adaptive_max_us=_adaptive(_get(conf, "interval_adaptive")),
        concurrency=_per_bucket(conf, "interval_concurrency", check_cap),
        burst=_per_bucket(conf, "interval_burst", check_units),
        limits=parse_limits(_get(conf, "interval_limits"), check_units),
        outer=parse_outer(_get(conf, "interval_outer"), queues_us),
        interactive_share=_per_bucket(
            conf, "interval_interactive_share", check_share, "a fraction (0.2)"
        ),
        store_url=_store_url(conf),
        queues_us=queues_us,
        key_prefix=str(_get(conf, "interval_key_prefix")),
        max_held=max_held,
        max_ahead_s=_seconds(conf, "interval_max_ahead_s"),
        hold_ahead_s=_seconds(conf, "interval_hold_ahead_s"),
        max_held_total=max_held_total,
        overflow=overflow,
        ledger_max=ledger_max,
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


def _adaptive(adaptive: Any) -> dict[str, int | None]:
    """``interval_adaptive``: bucket → True (the default slowest) or its slowest interval."""
    if not isinstance(adaptive, Mapping):
        raise ConfigurationError(
            f"interval_adaptive={adaptive!r}: expected a mapping of bucket to True or the "
            "slowest interval"
        )
    out: dict[str, int | None] = {}
    for name, value in adaptive.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"interval_adaptive key {name!r}: expected a non-empty name")
        if value is True:
            out[name] = None
        elif value is not False:
            out[name] = parse_interval_us(value, name=f"interval_adaptive[{name!r}]")
    return out


def check_share(value: Any, name: str) -> float:
    """An interactive share: a fraction of a bucket's rate, above 0 and below 1; else
    ``ConfigurationError`` naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value < 1
    ):
        raise ConfigurationError(
            f"{name}={value!r}: expected a fraction of the bucket's rate above 0 and below 1 "
            "(0.2 keeps a fifth for slot() callers)"
        )
    return float(value)


def check_cap(value: Any, name: str) -> int:
    """A concurrency cap: an integer >= 1; else ``ConfigurationError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name}={value!r}: expected an integer >= 1 (bodies at once)")
    return value


def check_units(value: Any, name: str) -> int:
    """A burst or a cost: an integer >= 1 (units of one interval's budget); else
    ``ConfigurationError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"{name}={value!r}: expected an integer >= 1 (units of one interval's budget)"
        )
    return value


def _per_bucket(
    conf: Any, key: str, check: Callable[[Any, str], _V], what: str = "an integer >= 1"
) -> dict[str, _V]:
    """A setting of bucket (queue) → ``what`` (``interval_concurrency``, ``interval_burst``,
    ``interval_interactive_share``), each value checked by ``check``."""
    per_bucket = _get(conf, key)
    if not isinstance(per_bucket, Mapping):
        raise ConfigurationError(f"{key}={per_bucket!r}: expected a mapping of bucket to {what}")
    out: dict[str, _V] = {}
    for name, value in per_bucket.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"{key} key {name!r}: expected a non-empty name")
        out[name] = check(value, f"{key}[{name!r}]")
    return out


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
    if is_redis_broker_url(broker):
        return broker
    raise ConfigurationError(
        "interval_store_url is not set (and the broker is not Redis): "
        "set it to redis://host:6379/0, rediss://…, file:///shared/dir or memory://"
    )
