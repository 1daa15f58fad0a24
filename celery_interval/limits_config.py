"""``interval_limits``: a bucket's extra limits, each a rate (or interval) and a burst."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery_interval.errors import ConfigurationError, short_repr
from celery_interval.intervals import FORMS, describe_rate, parse_interval_us
from celery_interval.schedule import Limit, Limits

__all__ = ["describe_limit", "describe_limits", "limit_dict", "parse_limits"]

_SHAPE = (
    "expected a mapping of bucket to a list of limits, each a rate such as '100/min' or a "
    "pair (rate, burst) such as ('1000/h', 50)"
)


def parse_limits(value: Any, check_units: Callable[[Any, str], int]) -> dict[str, Limits]:
    """``interval_limits``: bucket (queue) → a list of limits, each a rate (or interval, any
    form ``parse_interval_us`` reads) or a pair (rate, burst); the burst is checked by
    ``check_units`` (an integer >= 1; 1 when not given). Errors name the key and the entry."""
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"interval_limits={short_repr(value)}: {_SHAPE}")
    out: dict[str, Limits] = {}
    for name, entries in value.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"interval_limits key {name!r}: expected a non-empty name")
        said = f"interval_limits[{name!r}]"
        if isinstance(entries, str) or not isinstance(entries, list | tuple):
            raise ConfigurationError(f"{said}={short_repr(entries)}: {_SHAPE}")
        out[name] = tuple(
            _limit(entry, f"{said}[{i}]", check_units) for i, entry in enumerate(entries)
        )
    return out


def _limit(entry: Any, said: str, check_units: Callable[[Any, str], int]) -> Limit:
    if isinstance(entry, list | tuple):
        if len(entry) != 2:
            raise ConfigurationError(
                f"{said}={short_repr(entry)}: expected a rate or a pair (rate, burst); {FORMS}"
            )
        rate, burst = entry
        return Limit(parse_interval_us(rate, name=said), check_units(burst, f"{said} burst"))
    return Limit(parse_interval_us(entry, name=said))


def describe_limits(limits: Limits) -> str:
    """The limits as ``interval status`` shows them (``describe_limit`` each, comma-separated;
    ``"100/min"`` and ``("1000/h", 50)``: ``'100/min, 1000/h burst 50'``); '' for none."""
    return ", ".join(describe_limit(limit) for limit in limits)


def describe_limit(limit: Limit) -> str:
    """A limit's name on every surface (status, inspect, exporter, audit): its rate
    (``describe_rate``), with its burst when more than 1: ``'1000/h burst 50'``."""
    text = describe_rate(limit.interval_us)
    return text if limit.burst <= 1 else f"{text} burst {limit.burst}"


def limit_dict(limit: Limit) -> dict[str, Any]:
    """A limit in JSON (``status --json``, ``inspect interval_stats``): its name, rate,
    interval in seconds and burst."""
    return {
        "limit": describe_limit(limit),
        "rate": describe_rate(limit.interval_us),
        "interval_s": limit.interval_us / 1e6,
        "burst": limit.burst,
    }
