"""RedisStore: the model's operations as Lua scripts on Redis (standalone or Cluster)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

import redis
from redis.exceptions import (
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.sentinel import SentinelConnectionPool

import celery_interval.stores.keys as keys
from celery_interval.config.table import KEY_PREFIX, LEDGER_MAX, STORE_TIMEOUT_S
from celery_interval.config.values import check_int
from celery_interval.errors import ConfigurationError, StoreUnavailable
from celery_interval.schedule import (
    Backoff,
    Claim,
    ClaimTerms,
    Grant,
    Pace,
    Slot,
    Status,
    Unset,
)
from celery_interval.schedule.outer import Outer
from celery_interval.stores.base import DoneBatch, TaskCopy
from celery_interval.stores.codec import (
    claim_of,
    grant_of,
    status_from_reply,
    status_pace_args,
    unset_of,
)
from celery_interval.stores.line import ScriptLine
from celery_interval.stores.posted import PostedLine
from celery_interval.stores.redis_client import (
    client_for_url,
    codec_name,
    describe,
    store_errors,
)
from celery_interval.stores.redis_nested import NestedScripts, Nesting
from celery_interval.stores.redis_reads import RedisReads
from celery_interval.stores.scripts import (
    SCRIPT_NAMES,
    Named,
    batched,
    cap_args,
    not_after_arg,
    script_source,
    share_arg,
    taken_of,
)
from celery_interval.stores.tats import limits_arg
from celery_interval.stores.urls import mask_url

if TYPE_CHECKING:
    from celery_interval.stores.base import Store
    from celery_interval.stores.redis_client import RedisClient

__all__ = ["RedisStore"]


class RedisStore(NestedScripts, RedisReads):
    """The Store protocol on Redis: each operation is one Lua script on the store's clock.

    Every grant, claim and control action also appends one entry to the bucket's ledger, a
    Stream capped at about ``ledger_max`` entries, inside the same script (``ledger_max=0``
    turns the ledger off). ``now_us`` (test-only) replaces Redis ``TIME`` with an injected clock.

    A new bucket starts at once, unless the store itself is new (or lost its data) less than
    one interval ago: the birth marker ``<prefix>born`` says when. On a Redis Cluster the
    scripts cannot reach that key (it is in another hash slot than the bucket's), so there every
    new bucket's first start waits one interval. An idle bucket's state expires once a new one
    would act the same (``schedule.expires_in_us``); a paused or overridden one is kept.
    """

    def __init__(
        self,
        client: RedisClient | Callable[[], RedisClient],
        key_prefix: str = KEY_PREFIX,
        now_us: Callable[[], int] | None = None,
        ledger_max: int = LEDGER_MAX,
        *,
        where: str | None = None,
        nesting: Nesting | None = None,
    ) -> None:
        """``client`` is a redis-py client, or a function making one on first use (a Cluster
        client connects as it is made, and a store unreachable at start must not raise here).
        ``where`` names the store in errors (default: host and port of ``client``).
        ``nesting`` gives a nested bucket's outer bucket (None: not nested): its grants, claims
        and takes also spend the outer's budget (``schedule.outer``), and its keys carry the
        outer's hash tag (``keys.state_key``)."""
        check_int(ledger_max, "ledger_max", 0, "0 turns the ledger off")
        self._prefix = keys.validate_prefix(key_prefix)
        self._ledger_max = ledger_max
        self._nesting = nesting
        self._now_us = now_us
        self._connect: Callable[[], RedisClient] | None = None
        # Any: the installed redis stubs lag redis-py (no cluster scripting, no Script.sha).
        self._live: Any = None
        self._scripts: dict[str, Any] = {}
        self._line: ScriptLine | None = None
        self._posted: PostedLine | None = None
        self._born_keys: list[str] = []
        self._fenced = False
        if isinstance(client, redis.Redis | redis.RedisCluster):
            self._where = where or describe(client)
            self._use(client)
        else:
            self._connect = client
            self._where = where or "<a Redis client made on first use>"

    def _use(self, client: RedisClient) -> None:
        encoding = cast(Any, client).get_encoder().encoding
        if codec_name(encoding) != "utf-8":
            raise ConfigurationError(
                f"interval store {self._where}: encoding={encoding}: the store's keys and "
                "scripts are UTF-8 (drop encoding= from the store URL)"
            )
        self._live = cast(Any, client)
        self._fenced = not isinstance(client, redis.Redis) or isinstance(
            client.connection_pool, SentinelConnectionPool
        )
        self._scripts = {
            name: self._live.register_script(script_source(name, self._fenced))
            for name in SCRIPT_NAMES
        }
        # redis-py sends a RedisCluster's scripts itself (node routing, MOVED and failover).
        self._line = ScriptLine(client) if isinstance(client, redis.Redis) else None
        self._posted = PostedLine(client) if isinstance(client, redis.Redis) else None
        standalone = isinstance(client, redis.Redis)
        self._born_keys = [keys.born_key(self._prefix)] if standalone else []

    @property
    def _client(self) -> Any:
        """The redis-py client, made on first use when the store was given a factory."""
        return self._ensure_client()

    def client(self) -> Any:
        """The redis-py client (made on first use): for reads beside the scripts (bucket
        listings, the overflow index); wrap its calls in ``guard``."""
        return self._ensure_client()

    @property
    def fenced(self) -> bool:
        """Whether a master promoted after a failover fences each state it finds
        (``schedule.fenced``): a Sentinel or Cluster store; known once the client is made."""
        self._ensure_client()
        return self._fenced

    @property
    def prefix(self) -> str:
        """The key prefix of every key of this store."""
        return self._prefix

    def guard(self, op: str) -> AbstractContextManager[None]:
        """Raise redis-py's errors during ``op`` as ``StoreUnavailable`` or ``StoreError``."""
        return self._errors(op)

    def clock_arg(self) -> str:
        """The scripts' first argument: '' (Redis TIME), or the injected clock's now."""
        return self._now_arg()

    def _ensure_client(self) -> Any:
        if self._live is None and self._connect is not None:
            try:
                self._use(self._connect())
            except (RedisClusterException, RedisError, OSError) as exc:
                raise StoreUnavailable(f"interval store {self._where} unavailable: {exc}") from exc
        return self._live

    @classmethod
    def from_url(
        cls,
        url: str,
        key_prefix: str = KEY_PREFIX,
        *,
        socket_timeout_s: float = STORE_TIMEOUT_S,
        now_us: Callable[[], int] | None = None,
        ledger_max: int = LEDGER_MAX,
        nesting: Nesting | None = None,
    ) -> RedisStore:
        """A store on a redis://, rediss://, unix://, redis+cluster:// or rediss+cluster:// URL.

        A cluster URL lists seed nodes, ``redis+cluster://[user:password@]host:port[,host:port…]``,
        and takes the same query options as ``redis://`` (``rediss+cluster://``: TLS). A bad URL
        or option raises ConfigurationError; errors name the URL with its password masked.
        """
        shown = mask_url(url)
        return cls(
            client_for_url(url, shown, socket_timeout_s),
            key_prefix=key_prefix,
            now_us=now_us,
            ledger_max=ledger_max,
            where=shown,
            nesting=nesting,
        )

    # -- the Store protocol -------------------------------------------------------------

    def grant(self, copy: TaskCopy, pace: Pace) -> Grant:
        outer = self._nested(copy.bucket)
        if outer is not None:
            return self.grant_nested(copy, pace, outer)
        return grant_of(self._run("grant", self._task_keys(copy), self._grant_args(copy, pace)))

    def _grant_args(self, copy: TaskCopy, pace: Pace) -> list[str | int]:
        """grant_op's ARGV after the clock."""
        return [pace.interval_us, pace.not_before_in_us, copy.task_id, copy.retries,
                self._ledger_max, pace.burst, pace.cost, not_after_arg(pace),
                limits_arg(pace.limits), share_arg(pace)]  # fmt: skip

    def take(
        self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, *, done_first: DoneBatch | None = None
    ) -> tuple[Grant, Claim | None]:
        calls = [self._take_call(copy, pace, terms)]
        if done_first is not None:
            calls[:0] = self._done_calls(done_first.copies, done_first.dedupe_ttl_us)
        return taken_of(self._send("take", calls)[-1])

    def take_many(
        self, takes: Sequence[tuple[TaskCopy, Pace, ClaimTerms]]
    ) -> list[tuple[Grant, Claim | None]]:
        """``take`` of each (copy, pace, terms), in order, in one round trip (each take is
        atomic on its own; a script error raises after all ran). On a standalone Redis
        take_many.lua runs TAKES_PER_CALL takes per call; on a Cluster each is its own call."""
        calls = [self._take_call(copy, pace, terms) for copy, pace, terms in takes]
        if not calls:
            return []
        with self._errors("take"):
            self._ensure_client()
            if self._line is None:
                return [taken_of(r) for r in self._send("take", calls)]
            batches = batched(calls)
            sent = self._send("take", [call for call, _grouped in batches])
            replies = [
                r
                for (_call, grouped), reply in zip(batches, sent, strict=True)
                for r in (reply if grouped else [reply])
            ]
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
        return [taken_of(r) for r in replies]

    def _take_call(self, copy: TaskCopy, pace: Pace, terms: ClaimTerms) -> Named:
        outer = self._nested(copy.bucket)
        if outer is not None:
            return self._nested_take_call(copy, pace, terms, outer)
        return self._plain_take_call(copy, pace, terms)

    def _plain_take_call(self, copy: TaskCopy, pace: Pace, terms: ClaimTerms) -> Named:
        """take.lua's call: its keys and arguments (the clock's first)."""
        return (
            "take",
            self._task_keys(copy),
            [self._now_arg(), pace.interval_us, pace.not_before_in_us, copy.task_id, copy.retries,
             self._ledger_max, terms.holder, terms.lease_us, terms.lead_us, terms.handoff_us,
             *cap_args(copy, terms), terms.burst, terms.cost, not_after_arg(pace),
             limits_arg(pace.limits), limits_arg(terms.limits), share_arg(pace)],
        )  # fmt: skip

    def claim(
        self, copy: TaskCopy, interval_us: int, slot: Slot, terms: ClaimTerms, *, ticket: int = 0
    ) -> Claim:
        outer = self._nested(copy.bucket)
        if outer is not None:
            return self.claim_nested(copy, interval_us, slot, terms, outer, ticket=ticket)
        args = self._claim_args(copy, interval_us, slot, terms, ticket)
        return claim_of(self._run("claim", self._task_keys(copy), args))

    def _claim_args(
        self, copy: TaskCopy, interval_us: int, slot: Slot, terms: ClaimTerms, ticket: int
    ) -> list[str | int]:
        """claim_op's ARGV after the clock."""
        return [interval_us, slot.epoch, slot.slot_us, terms.holder, terms.lease_us,
                terms.lead_us, copy.task_id, copy.retries, ticket, self._ledger_max,
                terms.handoff_us, *cap_args(copy, terms), terms.burst, terms.cost,
                limits_arg(terms.limits)]  # fmt: skip

    def done(self, copies: Sequence[TaskCopy], dedupe_ttl_us: int) -> None:
        """One done script per bucket (its marks share a hash slot), all in one round trip on
        a standalone Redis; on a Cluster one call after another (a batch usually holds one
        bucket)."""
        if copies:
            self._send("done", self._done_calls(copies, dedupe_ttl_us))

    def _done_calls(self, copies: Sequence[TaskCopy], dedupe_ttl_us: int) -> list[Named]:
        now = self._now_arg()
        by_bucket: dict[str, list[str]] = {}
        for c in copies:
            by_bucket.setdefault(c.bucket, []).append(
                self._mark_key(c.bucket, c.task_id, c.retries)
            )
        return [("done", mark_keys, [now, dedupe_ttl_us]) for mark_keys in by_bucket.values()]

    @property
    def posts_done(self) -> bool:
        """A standalone Redis: yes; a Cluster: no (known once the client is made)."""
        return self._posted is not None

    def prepare_post(self) -> None:
        """Open (or check) the connection ``post_done`` writes on; on a Cluster, nothing."""
        with self._errors("done"):
            self._ensure_client()
            if self._posted is not None:
                self._posted.prepare()

    def post_done(self, copy: TaskCopy, dedupe_ttl_us: int) -> None:
        """The done script written on the prepared connection, its reply read at the next
        ``prepare_post``. On a Cluster nothing is sent (redis-py routes and waits there), and
        ``posts_done`` is False, so the worker marks the task at its ack instead."""
        with self._errors("done"):
            if self._posted is None:
                return
            ((_name, mark_keys, args),) = self._done_calls([copy], dedupe_ttl_us)
            self._posted.post((self._scripts["done"], mark_keys, args))

    def renew(self, bucket: str, task_id: str, retries: int, holder: str, lease_us: int) -> bool:
        r = self._run("renew", [self._mark_key(bucket, task_id, retries)], [holder, lease_us])
        return bool(int(r))

    def release(self, copy: TaskCopy) -> bool:
        return bool(int(self._run("release", [self._places_key(copy.bucket)], [copy.place])))

    def renew_place(self, copy: TaskCopy, place_us: int, cap: int | None = None) -> bool:
        args: list[str | int] = [copy.place, place_us, "" if cap is None else cap]
        r = self._run("renew_place", [self._places_key(copy.bucket)], args)
        return bool(int(r))

    def throttle(self, copy: TaskCopy, interval_us: int, backoff: Backoff) -> Status:
        adapt = "" if backoff.adapt_max_us is None else backoff.adapt_max_us
        r = self._run(
            "throttle",
            self._task_keys(copy),
            [interval_us, backoff.retry_after_us, backoff.ticket, copy.task_id, copy.retries,
             self._ledger_max, adapt, backoff.burst, backoff.cost, limits_arg(backoff.limits)],
        )  # fmt: skip
        return status_from_reply(r)

    def pause(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        args = [interval_us, self._ledger_max, *status_pace_args(pace)]
        return status_from_reply(self._run("pause", self._control_keys(bucket), args))

    def unpause(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        args = [interval_us, self._ledger_max, *status_pace_args(pace)]
        return status_from_reply(self._run("unpause", self._control_keys(bucket), args))

    def set_interval(
        self, bucket: str, interval_us: int, new_interval_us: int, pace: Pace | None = None
    ) -> Status:
        args = [interval_us, new_interval_us, self._ledger_max, *status_pace_args(pace)]
        return status_from_reply(self._run("set_interval", self._control_keys(bucket), args))

    def unset_interval(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Unset:
        args = [interval_us, self._ledger_max, *status_pace_args(pace)]
        return unset_of(self._run("unset_interval", self._control_keys(bucket), args))

    def reset(self, bucket: str) -> None:
        """Forget the bucket's state; its next epoch is born at the reset (reset.lua)."""
        self._run("reset", [self._state_key(bucket), self.ledger_key(bucket)], [self._ledger_max])

    def status(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        keys = [self._state_key(bucket), self._places_key(bucket), *self._born()]
        reply = self._run("status", keys, [interval_us, *status_pace_args(pace)])
        return status_from_reply(reply)

    def ping(self) -> None:
        with self._errors("ping"):
            self._client.ping()
            if self._line is not None:
                self._line.load(self._scripts.values())

    def close(self) -> None:
        if self._line is not None:
            self._line.close()
        if self._live is not None:
            with contextlib.suppress(RedisError, OSError):
                self._live.close()

    # -- internals ----------------------------------------------------------------------

    def _nested(self, bucket: str) -> Outer | None:
        """The outer bucket ``bucket`` is nested in, or None."""
        return None if self._nesting is None else self._nesting(bucket)

    def _state_key(self, bucket: str) -> str:
        return keys.state_key(self._prefix, keys.validate_bucket(bucket), self._outer(bucket))

    def _places_key(self, bucket: str) -> str:
        return keys.places_key(self._prefix, keys.validate_bucket(bucket), self._outer(bucket))

    def _mark_key(self, bucket: str, task_id: str, retries: int) -> str:
        return keys.mark_key(
            self._prefix, keys.validate_bucket(bucket), task_id, retries, self._outer(bucket)
        )

    def born_keys(self) -> list[str]:
        """The keys a status read takes after the bucket's: the birth marker's, or none on a
        Cluster (``stores.scan.read_statuses`` reads as ``status`` does)."""
        return self._born()

    def _born(self) -> list[str]:
        """The birth marker's key, or none on a Cluster (known once the client is made)."""
        self._ensure_client()
        return self._born_keys

    def _task_keys(self, copy: TaskCopy) -> list[str]:
        task_keys = keys.task_keys(
            self._prefix, copy.bucket, copy.task_id, copy.retries, self._outer(copy.bucket)
        )
        return [*task_keys, *self._born()]

    def _control_keys(self, bucket: str) -> list[str]:
        return [
            self._state_key(bucket),
            self.ledger_key(bucket),
            self._places_key(bucket),
            *self._born(),
        ]

    def _now_arg(self) -> str:
        return "" if self._now_us is None else str(int(self._now_us()))

    def _run(self, name: str, script_keys: list[str], args: list[str | int]) -> Any:
        """Run script ``name`` (EVALSHA, reloaded on NOSCRIPT) with the clock override first."""
        return self._send(name, [(name, script_keys, [self._now_arg(), *args])])[-1]

    def _send(self, op: str, calls: list[Named]) -> list[Any]:
        """The replies of the named scripts' calls, in order (one round trip on a standalone
        Redis); the first script error raises."""
        with self._errors(op):
            self._ensure_client()
            if self._line is not None:
                replies = self._line.run([(self._scripts[n], k, a) for n, k, a in calls])
            else:
                replies = [self._scripts[n](keys=k, args=a) for n, k, a in calls]
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
            return replies

    def _errors(self, op: str) -> AbstractContextManager[None]:
        return store_errors(self._where, op)


if TYPE_CHECKING:

    def _conforms(store: RedisStore) -> Store:
        return store
