"""Nested buckets on Redis: their scripts, and what a nested call adds to the plain one."""

from __future__ import annotations

from celery_interval.errors import ConfigurationError
from celery_interval.schedule.outer import Outer
from celery_interval.stores.nested import Nesting
from celery_interval.stores.tats import limits_arg

__all__ = [
    "NESTED_SCRIPTS",
    "Nesting",
    "check_nesting",
    "nested_keys",
    "outer_args",
    "tag_of",
]

#: The scripts of nested buckets (outer.lua's): grant, claim and take, each on a bucket and
#: its outer bucket.
NESTED_SCRIPTS = ("grant_nested", "claim_nested", "take_nested")


def tag_of(nesting: Nesting | None, bucket: str) -> str | None:
    """The name of the outer bucket ``nesting`` nests ``bucket`` in: its keys' hash tag."""
    outer = None if nesting is None else nesting(bucket)
    return None if outer is None else outer.bucket


def check_nesting(nesting: Nesting | None, bucket: str, outer: Outer) -> None:
    """Raise ConfigurationError unless the store's ``nesting`` nests ``bucket`` in ``outer``
    (the inner's keys must carry the outer's tag: one hash slot on a Cluster), and ``outer``
    in none (one level of nesting only)."""
    tagged = tag_of(nesting, bucket)
    if tagged != outer.bucket:
        raise ConfigurationError(
            f"bucket {bucket!r} is run nested in {outer.bucket!r}, but the store "
            f"nests it in {tagged!r} (its keys' hash tag): give the store "
            "the same outer declarations"
        )
    if tag_of(nesting, outer.bucket) is not None:
        raise ConfigurationError(
            f"outer bucket {outer.bucket!r} is itself nested: one level of nesting only"
        )


def nested_keys(task_keys: list[str], outer_key: str, fair_key: str) -> list[str]:
    """A nested script's keys: the inner bucket's four (``keys.task_keys``), the outer's state
    key and its fair share's, then the birth marker's if any."""
    return [*task_keys[:4], outer_key, fair_key, *task_keys[4:]]


def outer_args(outer: Outer, bucket: str) -> list[str | int]:
    """A nested script's arguments after the plain script's: the outer's interval_us, burst
    and extra limits, then ``bucket``'s weight and name in its fair share ('': none)."""
    fair: list[str | int] = ["", ""] if outer.weight is None else [outer.weight, bucket]
    return [outer.interval_us, outer.burst, limits_arg(outer.limits), *fair]
