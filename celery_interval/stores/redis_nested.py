"""RedisStore's nested-bucket scripts: a grant, claim or take in a bucket and its outer bucket."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from celery_interval.errors import ConfigurationError
from celery_interval.schedule import Claim, ClaimTerms, Grant, Pace, Slot
from celery_interval.schedule.outer import Outer
from celery_interval.stores import keys
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.codec import claim_of, grant_of
from celery_interval.stores.tats import limits_arg

__all__ = ["NESTED_SCRIPTS", "NestedScripts", "Nesting"]

#: The scripts of nested buckets (outer.lua's).
NESTED_SCRIPTS = ("grant_nested", "claim_nested", "take_nested")

#: A bucket's outer bucket (None: the bucket is not nested).
Nesting = Callable[[str], "Outer | None"]
#: A script call by the script's name: name, keys, arguments (the clock override first).
_Named = tuple[str, Sequence[str], Sequence[Any]]


class NestedScripts:
    """``grant_nested``, ``claim_nested`` and ``take_nested`` on Redis: the plain scripts'
    keys and arguments, then the outer's state key and its interval, burst and limits."""

    _prefix: str
    _nesting: Nesting | None

    def _state_key(self, bucket: str) -> str:
        raise NotImplementedError

    def _places_key(self, bucket: str) -> str:
        raise NotImplementedError

    def _nested(self, bucket: str) -> Outer | None:
        raise NotImplementedError

    def _outer(self, bucket: str) -> str | None:
        """The name of the outer bucket ``bucket`` is nested in (its keys carry that tag)."""
        outer = self._nested(bucket)
        return None if outer is None else outer.bucket

    def _task_keys(self, copy: TaskCopy) -> list[str]:
        raise NotImplementedError

    def _run(self, name: str, script_keys: list[str], args: list[str | int]) -> Any:
        raise NotImplementedError

    def _send(self, op: str, calls: list[_Named]) -> list[Any]:
        raise NotImplementedError

    def _grant_args(self, copy: TaskCopy, pace: Pace) -> list[str | int]:
        raise NotImplementedError

    def _claim_args(
        self, copy: TaskCopy, interval_us: int, slot: Slot, terms: ClaimTerms, ticket: int
    ) -> list[str | int]:
        raise NotImplementedError

    def _plain_take_call(self, copy: TaskCopy, pace: Pace, terms: ClaimTerms) -> _Named:
        raise NotImplementedError

    @property
    def nests(self) -> bool:
        """Whether some buckets of this store are nested (their keys carry another tag)."""
        return self._nesting is not None

    def status_keys(self, bucket: str) -> list[str]:
        """The status script's keys of ``bucket``: its state hash and its places."""
        return [self._state_key(bucket), self._places_key(bucket)]

    def grant_nested(self, copy: TaskCopy, pace: Pace, outer: Outer) -> Grant:
        """``schedule.outer.grant_nested`` (grant_nested.lua)."""
        args = [*self._grant_args(copy, pace), *_outer_args(outer)]
        return grant_of(self._run("grant_nested", self._nested_keys(copy, outer), args))

    def claim_nested(
        self,
        copy: TaskCopy,
        interval_us: int,
        slot: Slot,
        terms: ClaimTerms,
        outer: Outer,
        *,
        ticket: int = 0,
    ) -> Claim:
        """``schedule.outer.claim_nested`` (claim_nested.lua); ``ticket`` for the ledger."""
        args = [*self._claim_args(copy, interval_us, slot, terms, ticket), *_outer_args(outer)]
        return claim_of(self._run("claim_nested", self._nested_keys(copy, outer), args))

    def take_nested(
        self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, outer: Outer
    ) -> tuple[Grant, Claim | None]:
        """``schedule.outer.take_nested`` (take_nested.lua)."""
        reply = self._send("take", [self._nested_take_call(copy, pace, terms, outer)])[-1]
        return grant_of(reply), (claim_of(reply[6:]) if len(reply) > 6 else None)

    def _nested_take_call(
        self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, outer: Outer
    ) -> _Named:
        """take_nested.lua's call: take.lua's, then the outer's key and arguments."""
        _name, _keys, args = self._plain_take_call(copy, pace, terms)
        return "take_nested", self._nested_keys(copy, outer), [*args, *_outer_args(outer)]

    def _nested_keys(self, copy: TaskCopy, outer: Outer) -> list[str]:
        """The inner bucket's four keys, the outer's state key, then the birth marker if any;
        the inner's keys must carry the outer's tag (one hash slot on a Cluster)."""
        if self._outer(copy.bucket) != outer.bucket:
            raise ConfigurationError(
                f"bucket {copy.bucket!r} is run nested in {outer.bucket!r}, but the store "
                f"nests it in {self._outer(copy.bucket)!r} (its keys' hash tag): give the store "
                "the same outer declarations"
            )
        if self._outer(outer.bucket) is not None:
            raise ConfigurationError(
                f"outer bucket {outer.bucket!r} is itself nested: one level of nesting only"
            )
        task_keys = self._task_keys(copy)
        outer_key = keys.state_key(self._prefix, keys.validate_bucket(outer.bucket))
        return [*task_keys[:4], outer_key, *task_keys[4:]]


def _outer_args(outer: Outer) -> list[str | int]:
    """The outer's arguments: its interval_us, burst and extra limits."""
    return [outer.interval_us, outer.burst, limits_arg(outer.limits)]
