"""Values of settings and options: integers, fractions, seconds and extra limits, checked and
named; and how extra limits read back (status, inspect, exporter, audit)."""

from __future__ import annotations

import math
from typing import Any

from celery_interval.config.intervals import FORMS, describe_rate, parse_interval_us
from celery_interval.errors import ConfigurationError, short_repr
from celery_interval.schedule import Limit, Limits

__all__ = [
    "check_int",
    "check_seconds",
    "check_share",
    "describe_limit",
    "describe_limits",
    "limit_dict",
    "parse_limits",
]

_LIMITS_SHAPE = (
    "expected a list of limits, each a rate such as '100/min' or a pair (rate, burst) such "
    "as ('1000/h', 50)"
)


def check_int(value: Any, name: str, minimum: int, note: str = "") -> int:
    """``value`` if it is an integer (not a bool) >= ``minimum``; else ``ConfigurationError``
    naming ``name`` and the value (``note`` says what the number is, in parentheses)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        said = f" ({note})" if note else ""
        raise ConfigurationError(
            f"{name}={short_repr(value)}: expected an integer >= {minimum}{said}"
        )
    return value


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
            f"{name}={short_repr(value)}: expected a fraction of the bucket's rate above 0 and "
            "below 1 (0.2 keeps a fifth for slot() callers)"
        )
    return float(value)


def check_seconds(value: Any, name: str, *, allow_zero: bool = False) -> float:
    """A finite number of seconds > 0 (>= 0 with ``allow_zero``); else ``ConfigurationError``
    naming ``name``."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        said = f"{name}={short_repr(value)}"
        raise ConfigurationError(f"{said}: expected a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ConfigurationError(
            f"{name}={short_repr(value)}: expected a finite number of seconds > 0"
        )
    return seconds


def parse_limits(value: Any, said: str) -> Limits:
    """A bucket's extra limits: a list, each a rate (or interval, any form ``parse_interval_us``
    reads) or a pair (rate, burst), the burst an integer >= 1 (1 when not given). Errors name
    ``said`` and the entry."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigurationError(f"{said}={short_repr(value)}: {_LIMITS_SHAPE}")
    return tuple(_limit(entry, f"{said}[{i}]") for i, entry in enumerate(value))


def _limit(entry: Any, said: str) -> Limit:
    if isinstance(entry, list | tuple):
        if len(entry) != 2:
            raise ConfigurationError(
                f"{said}={short_repr(entry)}: expected a rate or a pair (rate, burst); {FORMS}"
            )
        rate, burst = entry
        units = check_int(burst, f"{said} burst", 1, "units of one interval's budget")
        return Limit(parse_interval_us(rate, name=said), units)
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
