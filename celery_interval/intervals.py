"""Parse an interval given as seconds or as a rate string into integer microseconds."""

from __future__ import annotations

import math
import re

from celery_interval.errors import ConfigurationError, short_repr

__all__ = ["MAX_INTERVAL_S", "US_PER_S", "parse_interval_us", "rate_text"]

US_PER_S = 1_000_000
#: The longest interval: a task held longer outlives any broker's redelivery timeout, and the
#: store's times (doubles in Lua) must stay exact integers while tickets pile up.
MAX_INTERVAL_S = 86_400
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([a-zA-Z]+)\s*$")
_UNIT_S = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def parse_interval_us(value: object, *, name: str = "interval") -> int:
    """Seconds (int/float/numeric string > 0, finite) or a rate ``"N/s|m|h"`` → microseconds."""
    said = f"{name}={short_repr(value)}"
    if isinstance(value, bool) or value is None:
        raise ConfigurationError(f"{said}: expected seconds > 0 or a rate like '10/s'")
    if isinstance(value, str):
        match = _RATE.match(value)
        if match:
            count, unit = float(match.group(1)), match.group(2).lower()
            per_s = _UNIT_S.get(unit.rstrip("s") if len(unit) > 1 else unit)
            if per_s is None:
                raise ConfigurationError(f"{said}: unknown rate unit {unit!r} (use s, m or h)")
            if count <= 0:
                raise ConfigurationError(f"{said}: a rate must be > 0")
            return _to_us(per_s / count, name, value)
        try:
            seconds = float(value)
        except ValueError:
            raise ConfigurationError(
                f"{said}: expected seconds > 0 or a rate like '10/s', '30/m', '100/h'"
            ) from None
        return _to_us(seconds, name, value)
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
        return _to_us(seconds, name, value)
    raise ConfigurationError(
        f"{said}: expected seconds > 0 or a rate like '10/s', not {type(value).__name__}"
    )


def _to_us(seconds: float, name: str, original: object) -> int:
    said = f"{name}={short_repr(original)}"
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{said}: an interval must be finite and > 0")
    if seconds > MAX_INTERVAL_S:
        raise ConfigurationError(f"{said}: longer than the maximum of {MAX_INTERVAL_S} s (one day)")
    interval_us = round(seconds * US_PER_S)
    if interval_us < 1:
        raise ConfigurationError(f"{said}: shorter than one microsecond")
    return interval_us


def rate_text(interval_us: int) -> str:
    """An interval as people read it: ``one start every 0.5s (2/s)``, ``… every 60s (1/m)``."""
    per_s = US_PER_S / interval_us
    if per_s >= 1:
        rate = f"{per_s:.4g}/s"
    elif per_s * 60 >= 1:
        rate = f"{per_s * 60:.4g}/m"
    else:
        rate = f"{per_s * 3600:.4g}/h"
    return f"one start every {interval_us / US_PER_S:g}s ({rate})"
