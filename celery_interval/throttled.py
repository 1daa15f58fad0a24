"""``Throttled``: what a task body raises when the service it called says to back off."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from celery_interval.config.intervals import MAX_INTERVAL_S, US_PER_S
from celery_interval.errors import ConfigurationError, short_repr

__all__ = ["Throttled", "retry_after_s_of"]

#: ``X-RateLimit-Reset`` above this is a Unix time in seconds (GitHub), above the next one in
#: milliseconds; below, seconds to wait (as ``RateLimit-Reset``).
_UNIX_S_FROM = 1e9
_UNIX_MS_FROM = 1e12


class Throttled(Exception):
    """Raise from an ``IntervalTask`` body when the called service said "retry after N s".

    No task of the bucket starts anywhere in the pool for ``retry_after_s`` (on the store's
    clock); this task is sent again with its retry count unchanged and keeps its place: the
    first slot after the wait is kept for it. The run ends in Celery's ``RETRY`` state.
    """

    def __init__(self, retry_after_s: float, *, reason: str = "") -> None:
        if (
            isinstance(retry_after_s, bool)
            or not isinstance(retry_after_s, (int, float))
            or not math.isfinite(retry_after_s)
            or not 0 <= retry_after_s <= MAX_INTERVAL_S
        ):
            raise ConfigurationError(
                f"Throttled(retry_after_s={short_repr(retry_after_s)}): expected seconds from 0 "
                f"to {MAX_INTERVAL_S}"
            )
        self.retry_after_s = float(retry_after_s)
        self.reason = reason
        #: False once the task was sent again as a plain copy (the store could not keep its
        #: place): the worker must not drop that copy as one of a body that began there.
        self.place_kept = True
        super().__init__(
            f"throttled for {self.retry_after_s:g}s" + (f": {reason}" if reason else "")
        )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by its wait, reason and whether its place was kept (a pool process sends it
        to its worker)."""
        return (_throttled, (self.retry_after_s, self.reason, self.place_kept))

    @property
    def retry_after_us(self) -> int:
        """``retry_after_s`` in whole microseconds."""
        return round(self.retry_after_s * US_PER_S)

    @classmethod
    def from_response(
        cls, response: Any, *, default_s: float = 1.0, now_s: float | None = None
    ) -> Throttled:
        """From an HTTP response (requests, httpx, urllib's ``HTTPError``) or its headers:
        ``Retry-After`` (seconds or an HTTP date), else ``RateLimit-Reset`` (seconds), else
        ``X-RateLimit-Reset`` (a Unix time, or seconds), else ``default_s``; capped at one day."""
        headers = getattr(response, "headers", response)
        found = retry_after_s_of(headers, time.time() if now_s is None else now_s)
        status = getattr(response, "status_code", None) or getattr(response, "status", None)
        reason = f"HTTP {status}" if isinstance(status, int) else ""
        wait_s = default_s if found is None else found
        return cls(min(max(0.0, wait_s), MAX_INTERVAL_S), reason=reason)


def _throttled(retry_after_s: float, reason: str, place_kept: bool = True) -> Throttled:
    exc = Throttled(retry_after_s, reason=reason)
    exc.place_kept = place_kept
    return exc


def _header(headers: Any, name: str) -> str | None:
    """A header's value, whatever the mapping's case rules (a plain dict is searched)."""
    if headers is None:
        return None
    value = headers.get(name) if hasattr(headers, "get") else None
    if value is None and isinstance(headers, Mapping):
        lowered = name.lower()
        value = next((v for k, v in headers.items() if str(k).lower() == lowered), None)
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return None if value is None else str(value).strip()


def _number(text: str | None) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def retry_after_s_of(headers: Any, now_s: float) -> float | None:
    """Seconds to wait that ``headers`` say, from ``now_s`` (Unix); None if none says it."""
    retry_after = _header(headers, "Retry-After")
    seconds = _number(retry_after)
    if seconds is not None:
        return max(0.0, seconds)
    if retry_after:
        try:
            return max(0.0, parsedate_to_datetime(retry_after).timestamp() - now_s)
        except (TypeError, ValueError, IndexError, OverflowError):
            pass
    seconds = _number(_header(headers, "RateLimit-Reset"))
    if seconds is not None:
        return max(0.0, seconds)
    reset = _number(_header(headers, "X-RateLimit-Reset"))
    if reset is None:
        return None
    if reset >= _UNIX_MS_FROM:
        reset /= 1000
    if reset >= _UNIX_S_FROM:
        return max(0.0, reset - now_s)
    return max(0.0, reset)
