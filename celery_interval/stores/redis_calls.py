"""ScriptCalls: each RedisStore operation as the script call it sends, built without I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import celery_interval.stores.keys as keys
from celery_interval.schedule import Backoff, ClaimTerms, Pace, Slot
from celery_interval.schedule.outer import Outer
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.codec import status_pace_args
from celery_interval.stores.redis_nested import (
    Nesting,
    check_nesting,
    nested_keys,
    outer_args,
    tag_of,
)
from celery_interval.stores.scripts import Named, cap_args, claimer_arg, not_after_arg, share_arg
from celery_interval.stores.tats import limits_arg

__all__ = ["ScriptCalls"]


class ScriptCalls:
    """The script calls of a RedisStore's operations: each a ``Named`` (script, keys,
    arguments), its first argument the clock's (``clock_arg``).

    A bucket's keys carry its hash tag, a nested bucket's (``nesting``) its outer's first
    (``keys``), and a nested bucket's grant, claim and take are its outer-spending scripts'
    (``redis_nested``). The keys of a call that may make a state end with the birth marker's
    on a standalone Redis: ``standalone`` says which it is once the store's client is made (so
    asking may make it, after the bucket's name was checked); nothing else here does I/O."""

    def __init__(
        self,
        prefix: str,
        ledger_max: int,
        now_us: Callable[[], int] | None,
        nesting: Nesting | None,
        standalone: Callable[[], bool],
    ) -> None:
        """``prefix``: a checked key prefix (``keys.validate_prefix``); ``ledger_max``: each
        ledger's cap; ``now_us``: the injected clock, or None for Redis ``TIME``."""
        self.prefix = prefix
        self._ledger_max = ledger_max
        self._now_us = now_us
        self._nesting = nesting
        self._standalone = standalone
        self._born = [keys.born_key(prefix)]
        self._born_settle = [*self._born, keys.settle_key(prefix)]

    # -- keys ---------------------------------------------------------------------------

    @property
    def nests(self) -> bool:
        """Whether some buckets of this store are nested (their keys carry another tag)."""
        return self._nesting is not None

    def nested(self, bucket: str) -> Outer | None:
        """The outer bucket ``bucket`` is nested in, or None."""
        return None if self._nesting is None else self._nesting(bucket)

    def state_key(self, bucket: str) -> str:
        """The key of ``bucket``'s state hash."""
        return keys.state_key(self.prefix, keys.validate_bucket(bucket), self._tag(bucket))

    def places_key(self, bucket: str) -> str:
        """The key of ``bucket``'s places (a sorted set)."""
        return keys.places_key(self.prefix, keys.validate_bucket(bucket), self._tag(bucket))

    def mark_key(self, bucket: str, task_id: str, retries: int) -> str:
        """The key of the mark of (task_id, retries) in ``bucket``."""
        return keys.mark_key(
            self.prefix, keys.validate_bucket(bucket), task_id, retries, self._tag(bucket)
        )

    def ledger_key(self, bucket: str) -> str:
        """The key of ``bucket``'s ledger Stream (in the bucket's hash slot)."""
        return keys.ledger_key(self.prefix, keys.validate_bucket(bucket), self._tag(bucket))

    def status_keys(self, bucket: str) -> list[str]:
        """The status script's keys of ``bucket``: its state hash and its places."""
        return [self.state_key(bucket), self.places_key(bucket)]

    def born_keys(self) -> list[str]:
        """The birth marker's key, or none on a Cluster (its scripts reach one hash slot)."""
        return self._born if self._standalone() else []

    def clock_arg(self) -> str:
        """The scripts' first argument: '' (Redis TIME), or the injected clock's now."""
        return "" if self._now_us is None else str(int(self._now_us()))

    def _tag(self, bucket: str) -> str | None:
        return tag_of(self._nesting, bucket)

    def _task_keys(self, copy: TaskCopy) -> list[str]:
        """A grant's, claim's or take's keys: ``keys.task_keys``, then the birth marker's and
        the done marks' settle window's (none on a Cluster)."""
        task_keys = keys.task_keys(
            self.prefix, copy.bucket, copy.task_id, copy.retries, self._tag(copy.bucket)
        )
        return [*task_keys, *(self._born_settle if self._standalone() else [])]

    def _control_keys(self, bucket: str) -> list[str]:
        """A control script's keys: the state, ledger and places, then the birth marker's."""
        return [
            self.state_key(bucket),
            self.ledger_key(bucket),
            self.places_key(bucket),
            *self.born_keys(),
        ]

    def _nested_keys(self, copy: TaskCopy, outer: Outer) -> list[str]:
        """A nested script's keys, once the store is found to nest the bucket in ``outer``."""
        check_nesting(self._nesting, copy.bucket, outer)
        task_keys = self._task_keys(copy)
        outer_name = keys.validate_bucket(outer.bucket)
        outer_key = keys.state_key(self.prefix, outer_name)
        return nested_keys(task_keys, outer_key, keys.fair_key(self.prefix, outer_name))

    # -- grants, claims and takes -------------------------------------------------------

    def grant(self, copy: TaskCopy, pace: Pace) -> Named:
        """grant.lua's call, or a nested bucket's ``grant_nested``."""
        outer = self.nested(copy.bucket)
        if outer is not None:
            return self.grant_nested(copy, pace, outer)
        return self._call("grant", self._task_keys(copy), self._grant_args(copy, pace))

    def grant_nested(self, copy: TaskCopy, pace: Pace, outer: Outer) -> Named:
        """grant_nested.lua's call: grant.lua's, then the outer's key and arguments."""
        args = [*self._grant_args(copy, pace), *outer_args(outer, copy.bucket)]
        return self._call("grant_nested", self._nested_keys(copy, outer), args)

    def claim(
        self, copy: TaskCopy, interval_us: int, slot: Slot, terms: ClaimTerms, ticket: int
    ) -> Named:
        """claim.lua's call (``ticket`` for the ledger), or a nested bucket's
        ``claim_nested``."""
        outer = self.nested(copy.bucket)
        if outer is not None:
            return self.claim_nested(copy, interval_us, slot, terms, outer, ticket)
        args = [*self._claim_args(copy, interval_us, slot, terms, ticket), claimer_arg(terms)]
        return self._call("claim", self._task_keys(copy), args)

    def claim_nested(
        self,
        copy: TaskCopy,
        interval_us: int,
        slot: Slot,
        terms: ClaimTerms,
        outer: Outer,
        ticket: int,
    ) -> Named:
        """claim_nested.lua's call: claim.lua's, then the outer's key and arguments."""
        args = [
            *self._claim_args(copy, interval_us, slot, terms, ticket),
            *outer_args(outer, copy.bucket),
            claimer_arg(terms),
        ]
        return self._call("claim_nested", self._nested_keys(copy, outer), args)

    def take(self, copy: TaskCopy, pace: Pace, terms: ClaimTerms) -> Named:
        """take.lua's call, or a nested bucket's ``take_nested``."""
        outer = self.nested(copy.bucket)
        if outer is not None:
            return self.take_nested(copy, pace, terms, outer)
        return self._plain_take(copy, pace, terms)

    def take_nested(self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, outer: Outer) -> Named:
        """take_nested.lua's call: take.lua's, then the outer's key and arguments."""
        _name, _keys, args = self._plain_take(copy, pace, terms)
        args = [*args[:-1], *outer_args(outer, copy.bucket), args[-1]]  # claimer_arg stays last
        return "take_nested", self._nested_keys(copy, outer), args

    def _plain_take(self, copy: TaskCopy, pace: Pace, terms: ClaimTerms) -> Named:
        return (
            "take",
            self._task_keys(copy),
            [self.clock_arg(), pace.interval_us, pace.not_before_in_us, copy.task_id,
             copy.retries, self._ledger_max, terms.holder, terms.lease_us, terms.lead_us,
             terms.handoff_us, *cap_args(copy, terms), terms.burst, terms.cost,
             not_after_arg(pace), limits_arg(pace.limits), limits_arg(terms.limits),
             share_arg(pace), claimer_arg(terms)],
        )  # fmt: skip

    def _grant_args(self, copy: TaskCopy, pace: Pace) -> list[str | int]:
        """grant_op's ARGV after the clock."""
        return [pace.interval_us, pace.not_before_in_us, copy.task_id, copy.retries,
                self._ledger_max, pace.burst, pace.cost, not_after_arg(pace),
                limits_arg(pace.limits), share_arg(pace)]  # fmt: skip

    def _claim_args(
        self, copy: TaskCopy, interval_us: int, slot: Slot, terms: ClaimTerms, ticket: int
    ) -> list[str | int]:
        """claim_op's ARGV after the clock."""
        return [interval_us, slot.epoch, slot.slot_us, terms.holder, terms.lease_us,
                terms.lead_us, copy.task_id, copy.retries, ticket, self._ledger_max,
                terms.handoff_us, *cap_args(copy, terms), terms.burst, terms.cost,
                limits_arg(terms.limits)]  # fmt: skip

    # -- marks and places ---------------------------------------------------------------

    def done(self, copies: Sequence[TaskCopy], dedupe_ttl_us: int) -> list[Named]:
        """done.lua's calls: one per bucket, its copies' mark keys (they share a hash slot)."""
        now = self.clock_arg()
        by_bucket: dict[str, list[str]] = {}
        for c in copies:
            by_bucket.setdefault(c.bucket, []).append(self.mark_key(c.bucket, c.task_id, c.retries))
        return [("done", mark_keys, [now, dedupe_ttl_us]) for mark_keys in by_bucket.values()]

    def renew(self, bucket: str, task_id: str, retries: int, holder: str, lease_us: int) -> Named:
        """renew.lua's call: the lease of (task_id, retries), if ``holder``'s."""
        return self._call("renew", [self.mark_key(bucket, task_id, retries)], [holder, lease_us])

    def release(self, copy: TaskCopy) -> Named:
        """release.lua's call: the copy's place in its bucket."""
        return self._call("release", [self.places_key(copy.bucket)], [copy.place])

    def renew_place(self, copy: TaskCopy, place_us: int, cap: int | None) -> Named:
        """renew_place.lua's call: the copy's place for ``place_us`` more (``cap``: '' = none)."""
        args: list[str | int] = [copy.place, place_us, "" if cap is None else cap]
        return self._call("renew_place", [self.places_key(copy.bucket)], args)

    # -- control and status -------------------------------------------------------------

    def throttle(self, copy: TaskCopy, interval_us: int, backoff: Backoff) -> Named:
        """throttle.lua's call."""
        adapt = "" if backoff.adapt_max_us is None else backoff.adapt_max_us
        return self._call(
            "throttle",
            self._task_keys(copy),
            [interval_us, backoff.retry_after_us, backoff.ticket, copy.task_id, copy.retries,
             self._ledger_max, adapt, backoff.burst, backoff.cost, limits_arg(backoff.limits)],
        )  # fmt: skip

    def pause(self, bucket: str, interval_us: int, pace: Pace | None) -> Named:
        """pause.lua's call (``pace``: read the status with its burst and limits)."""
        args = [interval_us, self._ledger_max, *status_pace_args(pace)]
        return self._call("pause", self._control_keys(bucket), args)

    def unpause(self, bucket: str, interval_us: int, pace: Pace | None) -> Named:
        """unpause.lua's call."""
        args = [interval_us, self._ledger_max, *status_pace_args(pace)]
        return self._call("unpause", self._control_keys(bucket), args)

    def set_interval(
        self, bucket: str, interval_us: int, new_interval_us: int, pace: Pace | None
    ) -> Named:
        """set_interval.lua's call."""
        args = [interval_us, new_interval_us, self._ledger_max, *status_pace_args(pace)]
        return self._call("set_interval", self._control_keys(bucket), args)

    def unset_interval(self, bucket: str, interval_us: int, pace: Pace | None) -> Named:
        """unset_interval.lua's call."""
        args = [interval_us, self._ledger_max, *status_pace_args(pace)]
        return self._call("unset_interval", self._control_keys(bucket), args)

    def reset(self, bucket: str) -> Named:
        """reset.lua's call: the state and the ledger (which records the reset)."""
        return self._call(
            "reset", [self.state_key(bucket), self.ledger_key(bucket)], [self._ledger_max]
        )

    def status(self, bucket: str, interval_us: int, pace: Pace | None) -> Named:
        """status.lua's call."""
        script_keys = [*self.status_keys(bucket), *self.born_keys()]
        return self._call("status", script_keys, [interval_us, *status_pace_args(pace)])

    def _call(self, name: str, script_keys: list[str], args: Sequence[str | int]) -> Named:
        """Script ``name``'s call: the clock's argument, then ``args``."""
        return name, script_keys, [self.clock_arg(), *args]
