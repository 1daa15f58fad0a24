"""Parse an interval (seconds between starts, or a rate of starts) into integer microseconds."""

from __future__ import annotations

import math
import re

from celery_interval.errors import ConfigurationError, short_repr

__all__ = [
    "FORMS",
    "MAX_INTERVAL_S",
    "RATE_UNITS_US",
    "US_PER_S",
    "bare_seconds_note",
    "describe_interval",
    "describe_rate",
    "parse_interval_us",
]

US_PER_S = 1_000_000
#: The longest interval: a task held longer outlives any broker's redelivery timeout, and the
#: store's times (doubles in Lua) must stay exact integers while tickets pile up.
MAX_INTERVAL_S = 86_400
#: What every refused interval is told to look like.
FORMS = (
    "give seconds between starts (0.5, '500ms', '2s') or a rate of starts ('10/s', '30/m', '100/h')"
)
#: A bare number at least this long reads as a rate typed without its unit; said when echoed.
LONG_BARE_S = 60
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_RATE = re.compile(rf"^\s*{_NUMBER}\s*/\s*([a-zA-Z]+)\s*$")
_DURATION = re.compile(rf"^\s*{_NUMBER}\s*([a-zA-Z]+)\s*$")
#: Seconds per unit of a rate, ``N/unit``: starts per second, minute or hour (Celery's forms).
_RATE_UNIT_S = {
    "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,
    "h": 3600, "hour": 3600, "hours": 3600,
}  # fmt: skip
#: Seconds per unit of a duration, ``N unit``: only units no one reads as a rate.
_DURATION_UNIT_S = {
    "ms": 0.001, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "min": 60, "mins": 60, "minute": 60, "minutes": 60,
}  # fmt: skip


def parse_interval_us(value: object, *, name: str = "interval") -> int:
    """The interval ``value`` in microseconds, or a ``ConfigurationError`` naming ``name``,
    quoting the value and saying what is meant.

    A bare number (int, float or numeric string) is **seconds between starts**: ``0.5`` is two
    starts a second. A duration names its unit: ``'500ms'``, ``'2s'``, ``'2 s'``, ``'1.5min'``.
    A rate is starts per unit, as Celery's ``rate_limit`` reads: ``'10/s'``, ``'30/m'``,
    ``'100/h'`` (also ``sec``, ``min``, ``hour``). ``'2m'`` and ``'2h'`` are refused: they read
    as a duration or as a rate with its slash left out.
    """
    said = f"{name}={short_repr(value)}"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigurationError(
            f"{said}: expected seconds > 0 or a rate, not {type(value).__name__}; {FORMS}"
        )
    if not isinstance(value, str):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
        return _to_us(seconds, said)
    return _to_us(_string_seconds(value, said), said)


def _string_seconds(value: str, said: str) -> float:
    """The seconds between starts a string names (see ``parse_interval_us``)."""
    rate = _RATE.match(value)
    if rate:
        count, unit = float(rate.group(1)), rate.group(2).lower()
        per_s = _RATE_UNIT_S.get(unit)
        if per_s is None:
            raise ConfigurationError(f"{said}: not an interval (no rate unit {unit!r}); {FORMS}")
        if count <= 0:
            raise ConfigurationError(f"{said}: a rate must be > 0")
        return per_s / count
    duration = _DURATION.match(value)
    if duration:
        number, unit = duration.group(1), duration.group(2).lower()
        if unit in ("m", "h"):
            minutes = float(number) * (1 if unit == "m" else 60)
            span, per = ("minutes", "a minute") if unit == "m" else ("hours", "an hour")
            raise ConfigurationError(
                f"{said}: ambiguous; write '{minutes:g}min' for {number} {span} between starts, "
                f"or '{number}/{unit}' for {number} starts {per}"
            )
        per_unit_s = _DURATION_UNIT_S.get(unit)
        if per_unit_s is None:
            raise ConfigurationError(f"{said}: not an interval (no unit {unit!r}); {FORMS}")
        return float(number) * per_unit_s
    try:
        return float(value)
    except ValueError:
        raise ConfigurationError(f"{said}: not an interval; {FORMS}") from None


def _to_us(seconds: float, said: str) -> int:
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{said}: an interval must be finite and > 0")
    if seconds > MAX_INTERVAL_S:
        raise ConfigurationError(f"{said}: longer than the maximum of {MAX_INTERVAL_S} s (one day)")
    interval_us = round(seconds * US_PER_S)
    if interval_us < 1:
        raise ConfigurationError(f"{said}: shorter than one microsecond")
    return interval_us


def describe_interval(interval_us: int) -> str:
    """How an interval reads both ways: ``'100s (one start every 100 s = 0.01/s)'``."""
    seconds = _plain(interval_us / US_PER_S, 7)
    return f"{seconds}s (one start every {seconds} s = {_plain(US_PER_S / interval_us, 4)}/s)"


#: The units a rate is shown in (``describe_rate``), the shortest first: µs per unit.
RATE_UNITS_US = (("s", US_PER_S), ("min", 60 * US_PER_S), ("h", 3600 * US_PER_S))


def describe_rate(interval_us: int) -> str:
    """An interval as the rate it was most likely written as: ``N/unit`` in the first unit
    (s, min, h) where a whole N gives ``interval_us`` back (``600000`` -> ``'100/min'``,
    ``2000000`` -> ``'30/min'``), else its seconds (``700000`` -> ``'0.7s'``); both read back
    by ``parse_interval_us``. ``spark.limits.rate_text`` is the same as a Column."""
    for unit, unit_us in RATE_UNITS_US:
        count = math.floor(unit_us / interval_us + 0.5)
        if count >= 1 and abs(2 * (unit_us - count * interval_us)) <= count:
            return f"{count}/{unit}"
    return f"{interval_us / US_PER_S:.6f}".rstrip("0").rstrip(".") + "s"


def bare_seconds_note(value: object, interval_us: int) -> str | None:
    """A note for a bare number of at least ``LONG_BARE_S`` seconds (``100``), which may be a
    rate typed without its unit: it says how to write the rate. None for any other value."""
    bare = not isinstance(value, bool) and isinstance(value, (int, float))
    if isinstance(value, str):
        try:
            float(value)
            bare = True
        except ValueError:
            bare = False
    if not bare or interval_us < LONG_BARE_S * US_PER_S:
        return None
    count = _plain(interval_us / US_PER_S, 7)
    return (
        f"note: a bare number is seconds between starts; for {count} starts a second "
        f"write {count}/s"
    )


def _plain(x: float, digits: int) -> str:
    """``x`` > 0 to about ``digits`` significant digits, never in exponent notation."""
    places = max(0, digits - 1 - math.floor(math.log10(x)))
    text = f"{x:.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
