"""RedisStore: the model's operations as Lua scripts on Redis (standalone or Cluster)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import celery_interval.stores.keys as keys
from celery_interval.config.table import KEY_PREFIX, LEDGER_MAX, STORE_TIMEOUT_S
from celery_interval.config.values import check_int
from celery_interval.schedule import (
    Backoff,
    BucketState,
    Claim,
    ClaimTerms,
    Grant,
    Mark,
    Pace,
    Places,
    Slot,
    Status,
    Unset,
)
from celery_interval.schedule.fair import FairShare
from celery_interval.schedule.outer import Outer
from celery_interval.stores.base import DoneBatch, TaskCopy
from celery_interval.stores.codec import (
    claim_of,
    flag_of,
    grant_of,
    status_from_reply,
    unset_of,
)
from celery_interval.stores.nested import Nesting
from celery_interval.stores.redis_calls import ScriptCalls
from celery_interval.stores.redis_client import client_for_url
from celery_interval.stores.redis_link import RedisLink
from celery_interval.stores.redis_reads import RedisReads
from celery_interval.stores.scripts import Named, taken_of
from celery_interval.stores.urls import mask_url

if TYPE_CHECKING:
    from celery_interval.stores.base import Store
    from celery_interval.stores.redis_client import RedisClient

__all__ = ["RedisStore"]


class RedisStore:
    """The Store protocol on Redis: each operation is one Lua script on the store's clock.

    Every grant, claim and control action also appends one entry to the bucket's ledger, a
    Stream capped at about ``ledger_max`` entries, inside the same script (``ledger_max=0``
    turns the ledger off). ``now_us`` (test-only) replaces Redis ``TIME`` with an injected clock.

    A new bucket starts at once, unless the store itself is new (or lost its data) less than
    one interval ago: the birth marker ``<prefix>born`` says when. On a Redis Cluster the
    scripts cannot reach that key (it is in another hash slot than the bucket's), so there every
    new bucket's first start waits one interval. An idle bucket's state expires once a new one
    would act the same (``schedule.expires_in_us``); a paused or overridden one is kept.

    Each operation builds its script call (``ScriptCalls``: keys and arguments), sends it
    (``RedisLink``: the client, its scripts and lines) and decodes the reply (``codec``); the
    plain reads beside the scripts are ``RedisReads``'.
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
        prefix = keys.validate_prefix(key_prefix)
        self._link = RedisLink(client, where)
        self._calls = ScriptCalls(prefix, ledger_max, now_us, nesting, self._link.standalone)
        self._reads = RedisReads(self._calls, self._link)

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

    # -- beside the scripts: the client, keys and plain reads ---------------------------

    def client(self) -> Any:
        """The redis-py client (made on first use): for reads beside the scripts (bucket
        listings, the overflow index); wrap its calls in ``guard``."""
        return self._link.client()

    def guard(self, op: str) -> AbstractContextManager[None]:
        """Raise redis-py's errors during ``op`` as ``StoreUnavailable`` or ``StoreError``."""
        return self._link.errors(op)

    @property
    def fenced(self) -> bool:
        """Whether a master promoted after a failover fences each state it finds
        (``schedule.fenced``): a Sentinel or Cluster store; known once the client is made."""
        return self._link.fenced

    @property
    def prefix(self) -> str:
        """The key prefix of every key of this store."""
        return self._calls.prefix

    @property
    def nests(self) -> bool:
        """Whether some buckets of this store are nested (their keys carry another tag)."""
        return self._calls.nests

    def clock_arg(self) -> str:
        """The scripts' first argument: '' (Redis TIME), or the injected clock's now."""
        return self._calls.clock_arg()

    def born_keys(self) -> list[str]:
        """The keys a status read takes after the bucket's: the birth marker's, or none on a
        Cluster (``stores.scan.read_statuses`` reads as ``status`` does)."""
        return self._calls.born_keys()

    def status_keys(self, bucket: str) -> list[str]:
        """The status script's keys of ``bucket``: its state hash and its places."""
        return self._calls.status_keys(bucket)

    def ledger_key(self, bucket: str) -> str:
        """The key of ``bucket``'s ledger Stream (in the bucket's hash slot)."""
        return self._calls.ledger_key(bucket)

    def ledger(
        self, bucket: str, start_id: str = "-", count: int = 1000
    ) -> list[tuple[str, dict[str, str]]]:
        """One page of ``bucket``'s ledger, oldest first (``RedisReads.ledger``)."""
        return self._reads.ledger(bucket, start_id, count)

    def read_state(self, bucket: str) -> BucketState | None:
        """The bucket's raw state record, or None; for tests, ``status`` and debugging."""
        return self._reads.read_state(bucket)

    def read_places(self, bucket: str) -> Places:
        """The bucket's places as stored (expired ones until a script drops them)."""
        return self._reads.read_places(bucket)

    def read_fair(self, outer: str) -> tuple[FairShare, int]:
        """An outer bucket's fair share as stored (empty: none), and the store's clock (µs)."""
        return self._reads.read_fair(outer)

    def read_mark(self, bucket: str, task_id: str, retries: int) -> Mark | None:
        """The stored mark of (task_id, retries), expired or not, or None."""
        return self._reads.read_mark(bucket, task_id, retries)

    # -- the Store protocol -------------------------------------------------------------

    def grant(self, copy: TaskCopy, pace: Pace) -> Grant:
        return grant_of(self._run(self._calls.grant(copy, pace)))

    def take(
        self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, *, done_first: DoneBatch | None = None
    ) -> tuple[Grant, Claim | None]:
        calls = [self._calls.take(copy, pace, terms)]
        if done_first is not None:
            calls[:0] = self._calls.done(done_first.copies, done_first.dedupe_ttl_us)
        return taken_of(self._link.send("take", calls)[-1])

    def take_many(
        self, takes: Sequence[tuple[TaskCopy, Pace, ClaimTerms]]
    ) -> list[tuple[Grant, Claim | None]]:
        """``take`` of each (copy, pace, terms), in order, in one round trip (each take is
        atomic on its own; a script error raises after all ran). On a standalone Redis
        take_many.lua runs TAKES_PER_CALL takes per call; on a Cluster each is its own call."""
        calls = [self._calls.take(copy, pace, terms) for copy, pace, terms in takes]
        if not calls:
            return []
        return [taken_of(reply) for reply in self._link.send_takes(calls)]

    def claim(
        self, copy: TaskCopy, interval_us: int, slot: Slot, terms: ClaimTerms, *, ticket: int = 0
    ) -> Claim:
        return claim_of(self._run(self._calls.claim(copy, interval_us, slot, terms, ticket)))

    def done(self, copies: Sequence[TaskCopy], dedupe_ttl_us: int) -> None:
        """One done script per bucket (its marks share a hash slot), all in one round trip on
        a standalone Redis; on a Cluster one call after another (a batch usually holds one
        bucket)."""
        if copies:
            self._link.send("done", self._calls.done(copies, dedupe_ttl_us))

    @property
    def posts_done(self) -> bool:
        """A standalone Redis: yes; a Cluster: no (known once the client is made)."""
        return self._link.posts

    def prepare_post(self) -> None:
        """Open (or check) the connection ``post_done`` writes on; on a Cluster, nothing."""
        self._link.prepare_post("done")

    def settle_post(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the posted marks to be answered, sending again what a
        lost connection took; on a Cluster, nothing."""
        self._link.settle_post("done", timeout_s)

    def post_done(self, copy: TaskCopy, dedupe_ttl_us: int) -> None:
        """The done script written on the prepared connection, its reply read at the next
        ``prepare_post``. On a Cluster nothing is sent (redis-py routes and waits there), and
        ``posts_done`` is False, so the worker marks the task at its ack instead."""
        if self._link.posts:
            (call,) = self._calls.done([copy], dedupe_ttl_us)
            self._link.post("done", call)

    def renew(self, bucket: str, task_id: str, retries: int, holder: str, lease_us: int) -> bool:
        return flag_of(self._run(self._calls.renew(bucket, task_id, retries, holder, lease_us)))

    def release(self, copy: TaskCopy) -> bool:
        return flag_of(self._run(self._calls.release(copy)))

    def renew_place(self, copy: TaskCopy, place_us: int, cap: int | None = None) -> bool:
        return flag_of(self._run(self._calls.renew_place(copy, place_us, cap)))

    def throttle(self, copy: TaskCopy, interval_us: int, backoff: Backoff) -> Status:
        return status_from_reply(self._run(self._calls.throttle(copy, interval_us, backoff)))

    def pause(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        return status_from_reply(self._run(self._calls.pause(bucket, interval_us, pace)))

    def unpause(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        return status_from_reply(self._run(self._calls.unpause(bucket, interval_us, pace)))

    def set_interval(
        self, bucket: str, interval_us: int, new_interval_us: int, pace: Pace | None = None
    ) -> Status:
        call = self._calls.set_interval(bucket, interval_us, new_interval_us, pace)
        return status_from_reply(self._run(call))

    def unset_interval(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Unset:
        return unset_of(self._run(self._calls.unset_interval(bucket, interval_us, pace)))

    def reset(self, bucket: str) -> None:
        """Forget the bucket's state; its next epoch is born at the reset (reset.lua)."""
        self._run(self._calls.reset(bucket))

    def status(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        return status_from_reply(self._run(self._calls.status(bucket, interval_us, pace)))

    def born_us(self) -> int | None:
        return self._reads.born_us()

    def ping(self) -> None:
        self._link.ping()

    def close(self) -> None:
        self._link.close()

    # -- nested buckets: a grant, claim or take in a bucket and its outer bucket ---------

    def grant_nested(self, copy: TaskCopy, pace: Pace, outer: Outer) -> Grant:
        """``schedule.outer.grant_nested`` (grant_nested.lua)."""
        return grant_of(self._run(self._calls.grant_nested(copy, pace, outer)))

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
        call = self._calls.claim_nested(copy, interval_us, slot, terms, outer, ticket)
        return claim_of(self._run(call))

    def take_nested(
        self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, outer: Outer
    ) -> tuple[Grant, Claim | None]:
        """``schedule.outer.take_nested`` (take_nested.lua)."""
        call = self._calls.take_nested(copy, pace, terms, outer)
        return taken_of(self._link.send("take", [call])[-1])

    def _run(self, call: Named) -> Any:
        """The reply of one script call, sent as the operation its script is named for."""
        return self._link.send(call[0], [call])[-1]


if TYPE_CHECKING:

    def _conforms(store: RedisStore) -> Store:
        return store
