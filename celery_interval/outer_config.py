"""``interval_outer``: which bucket's budget an inner bucket's (a tenant's) tasks also spend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_interval.buckets import queue_of
from celery_interval.errors import ConfigurationError, short_repr

__all__ = ["outer_name", "parse_outer"]

_SHAPE = (
    "expected a mapping of bucket (or 'queue:*', its tenant buckets) to its outer bucket, "
    "e.g. {'api:*': 'api'}"
)


def parse_outer(value: Any, queues: Mapping[str, int]) -> dict[str, str]:
    """``interval_outer``: inner bucket, or ``queue:*`` for every ``queue:key`` bucket of a
    queue, → its outer bucket, a bucket of ``interval_queues`` (or one of their tenant buckets).
    One level: an outer bucket is not nested itself. Names hold no braces (the keys of a nested
    bucket carry its outer's hash tag). Errors name the key and the entry."""
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"interval_outer={short_repr(value)}: {_SHAPE}")
    out: dict[str, str] = {}
    for inner, outer in value.items():
        said = f"interval_outer[{inner!r}]"
        if not isinstance(inner, str) or not inner or "*" in inner.removesuffix(":*"):
            raise ConfigurationError(
                f"interval_outer key {inner!r}: expected a bucket name or 'queue:*'"
            )
        if not isinstance(outer, str) or not outer:
            raise ConfigurationError(f"{said}={short_repr(outer)}: expected a bucket name")
        for name in (inner, outer):
            if "{" in name or "}" in name:
                raise ConfigurationError(
                    f"{said}={outer!r}: {name!r} has a brace; nested buckets' keys are "
                    "hash-tagged by their outer bucket's name"
                )
        if queue_of(outer) not in queues:
            raise ConfigurationError(
                f"{said}={outer!r}: the outer bucket needs an interval: its queue "
                f"{queue_of(outer)!r} is not in interval_queues"
            )
        if inner == outer:
            raise ConfigurationError(f"{said}={outer!r}: a bucket is not nested in itself")
        out[inner] = outer
    for inner, outer in out.items():
        if outer_name(out, outer) is not None:
            raise ConfigurationError(
                f"interval_outer[{inner!r}]={outer!r}: {outer!r} is nested itself "
                f"(in {outer_name(out, outer)!r}); one level of nesting only"
            )
    return out


def outer_name(outer: Mapping[str, str], bucket: str) -> str | None:
    """The outer bucket of ``bucket``: its own entry, else its queue's ``queue:*`` one (for a
    ``queue:key`` bucket); None: not nested (a bucket is never its own outer)."""
    name = outer.get(bucket)
    if name is None and ":" in bucket:
        name = outer.get(f"{queue_of(bucket)}:*")
    return None if name == bucket else name
