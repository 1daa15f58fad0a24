"""RedisStore: the model's operations as Lua scripts on Redis (standalone or Cluster)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any, TypeAlias, cast
from urllib.parse import urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from celery_interval.errors import ConfigurationError, StoreError, StoreUnavailable
from celery_interval.schedule import BucketState, Claim, Done, Grant, Lease, Mark, Outcome, Status
from celery_interval.stores import keys, mask_url
from celery_interval.stores.base import DoneMark

if TYPE_CHECKING:
    from celery_interval.stores.base import Store

    RedisClient: TypeAlias = "redis.Redis | redis.RedisCluster"

__all__ = ["DEFAULT_LEDGER_MAX", "SCRIPT_NAMES", "RedisStore", "script_source"]

SCRIPT_NAMES = (
    "grant",
    "claim",
    "done",
    "renew",
    "pause",
    "unpause",
    "set_interval",
    "status",
    "reset",
)

#: Errors meaning "the store cannot be reached right now": held tasks are retried later.
_UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisConnectionError,  # includes BusyLoadingError and AuthenticationError
    RedisTimeoutError,
    BusyLoadingError,
    ClusterDownError,  # includes MasterDownError
    TryAgainError,
    ReadOnlyError,  # a failover left us talking to a replica
)

DEFAULT_SOCKET_TIMEOUT_S = 5.0
DEFAULT_HEALTH_CHECK_INTERVAL_S = 30
#: About this many entries are kept in each bucket's ledger Stream (XADD MAXLEN ~).
DEFAULT_LEDGER_MAX = 100_000


def _lua_text(name: str) -> str:
    return (files("celery_interval.stores") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def script_source(name: str) -> str:
    """The full text sent to Redis for script ``name``: lib.lua followed by ``<name>.lua``."""
    if name not in SCRIPT_NAMES:
        raise ValueError(f"unknown script {name!r}")
    return _lua_text("lib") + "\n" + _lua_text(name)


def _describe(client: RedisClient) -> str:
    """Where ``client`` points, without credentials, for one-line error messages."""
    pool: Any = getattr(client, "connection_pool", None)
    if pool is not None:
        kw: dict[str, Any] = dict(getattr(pool, "connection_kwargs", {}))
        if kw.get("path"):
            return f"unix://{kw['path']}?db={kw.get('db', 0)}"
        scheme = (
            "rediss"
            if "ssl" in getattr(pool, "connection_class", type).__name__.lower()
            else "redis"
        )
        return f"{scheme}://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
    manager: Any = getattr(client, "nodes_manager", None)
    nodes: Any = getattr(manager, "startup_nodes", None) or {}
    names = list(nodes)[:3] if isinstance(nodes, dict) else []
    return "redis cluster " + (",".join(str(n) for n in names) or "<unknown nodes>")


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _status(reply: Sequence[Any]) -> Status:
    """Decode lib.lua's ``status_reply`` array."""
    (exists, epoch, interval_us, overridden, paused, ticket, next_in, cur, last, v) = (
        int(x) for x in reply
    )
    return Status(
        exists=bool(exists),
        epoch=epoch,
        interval_us=interval_us,
        overridden=bool(overridden),
        paused=bool(paused),
        ticket=ticket,
        next_slot_in_us=next_in,
        current_slot_us=cur,
        last_start_us=last,
        virtual_now_us=v,
    )


def decode_mark(raw: str | bytes | None) -> Mark | None:
    """Parse a mark value (``L|holder|start_us|expires_real_us`` or ``D|expires_real_us``)."""
    if raw is None:
        return None
    value = _text(raw)
    if value.startswith("D|"):
        return Done(int(value[2:]))
    if value.startswith("L|"):
        head, start_us, expires_us = value.rsplit("|", 2)
        return Lease(head[2:], int(start_us), int(expires_us))
    raise StoreError(f"malformed interval mark {value!r}")


class RedisStore:
    """The Store protocol on Redis: each operation is one Lua script on the store's clock.

    Every grant, claim and control action also appends one entry to the bucket's ledger, a
    Stream capped at about ``ledger_max`` entries, inside the same script (``ledger_max=0``
    turns the ledger off). ``now_us`` (test-only) replaces Redis ``TIME`` with an injected clock.
    """

    def __init__(
        self,
        client: RedisClient,
        key_prefix: str = keys.DEFAULT_PREFIX,
        now_us: Callable[[], int] | None = None,
        ledger_max: int = DEFAULT_LEDGER_MAX,
    ) -> None:
        if isinstance(ledger_max, bool) or not isinstance(ledger_max, int) or ledger_max < 0:
            raise ConfigurationError(
                f"ledger_max must be an integer >= 0 (0 turns the ledger off), got {ledger_max!r}"
            )
        # Any: the installed redis stubs lag redis-py (no cluster scripting, no Script.sha).
        self._client: Any = cast(Any, client)
        self._prefix = keys.validate_prefix(key_prefix)
        self._ledger_max = ledger_max
        self._now_us = now_us
        self._where = _describe(client)
        self._is_cluster = isinstance(client, redis.RedisCluster)
        self._scripts: dict[str, Any] = {
            name: self._client.register_script(script_source(name)) for name in SCRIPT_NAMES
        }

    @classmethod
    def from_url(
        cls,
        url: str,
        key_prefix: str = keys.DEFAULT_PREFIX,
        *,
        socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        now_us: Callable[[], int] | None = None,
        ledger_max: int = DEFAULT_LEDGER_MAX,
    ) -> RedisStore:
        """A store on a redis://, rediss:// or unix:// URL; a bad one raises ConfigurationError."""
        shown = mask_url(url)
        try:
            scheme = urlsplit(url).scheme
        except ValueError as exc:
            raise ConfigurationError(f"malformed interval store URL {shown!r}: {exc}") from None
        if scheme not in ("redis", "rediss", "unix"):
            raise ConfigurationError(
                f"interval store URL {shown!r} must start with redis://, rediss:// or unix://"
            )
        try:
            client: redis.Redis = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
                health_check_interval=DEFAULT_HEALTH_CHECK_INTERVAL_S,
                # One quick retry covers a pooled connection the server closed; longer outages
                # surface as StoreUnavailable and the caller holds its tasks and backs off.
                retry=Retry(ExponentialBackoff(cap=0.1, base=0.01), 1),
            )
        except ValueError as exc:
            raise ConfigurationError(f"malformed interval store URL {shown!r}: {exc}") from None
        return cls(client, key_prefix=key_prefix, now_us=now_us, ledger_max=ledger_max)

    # -- the Store protocol -------------------------------------------------------------

    def grant(
        self,
        bucket: str,
        task_id: str,
        retries: int,
        interval_us: int,
        not_before_in_us: int = 0,
    ) -> Grant:
        r = self._run(
            "grant",
            [
                self._state_key(bucket),
                self._mark_key(bucket, task_id, retries),
                self.ledger_key(bucket),
            ],
            [interval_us, not_before_in_us, task_id, retries, self._ledger_max],
        )
        return Grant(
            outcome=Outcome(_text(r[0])),
            epoch=int(r[1]),
            ticket=int(r[2]),
            slot_us=int(r[3]),
            delay_us=int(r[4]),
            paused=bool(int(r[5])),
        )

    def claim(
        self,
        bucket: str,
        task_id: str,
        retries: int,
        interval_us: int,
        epoch: int,
        slot_us: int,
        holder: str,
        lease_us: int,
        lead_us: int = 0,
        *,
        ticket: int = 0,
        handoff_us: int = 0,
    ) -> Claim:
        r = self._run(
            "claim",
            [
                self._state_key(bucket),
                self._mark_key(bucket, task_id, retries),
                self.ledger_key(bucket),
            ],
            [
                interval_us,
                epoch,
                slot_us,
                holder,
                lease_us,
                lead_us,
                task_id,
                retries,
                ticket,
                self._ledger_max,
                handoff_us,
            ],
        )
        return Claim(Outcome(_text(r[0])), int(r[1]), int(r[2]), int(r[3]))

    def done(self, marks: Sequence[DoneMark], dedupe_ttl_us: int) -> None:
        """One done script per bucket (its marks share a hash slot), pipelined on one Redis.

        redis-py refuses EVALSHA in a RedisCluster pipeline, so on a Cluster the per-bucket
        calls go one after another (a batch usually holds one bucket).
        """
        if not marks:
            return
        now = self._now_arg()
        by_bucket: dict[str, list[str]] = {}
        for m in marks:
            by_bucket.setdefault(m.bucket, []).append(
                self._mark_key(m.bucket, m.task_id, m.retries)
            )
        script = self._scripts["done"]
        with self._errors("done"):
            if self._is_cluster:
                for mark_keys in by_bucket.values():
                    script(keys=mark_keys, args=[now, dedupe_ttl_us])
                return
            for attempt in range(2):
                pipe = self._client.pipeline(transaction=False)
                for mark_keys in by_bucket.values():
                    # EVALSHA straight into the pipeline: one round trip (redis-py's Script in a
                    # Pipeline sends SCRIPT EXISTS first). done is idempotent, so after NOSCRIPT
                    # (server restarted, SCRIPT FLUSH) the script is loaded and the batch resent.
                    pipe.evalsha(script.sha, len(mark_keys), *mark_keys, now, dedupe_ttl_us)
                results = pipe.execute(raise_on_error=False)
                errors = [r for r in results if isinstance(r, Exception)]
                if not errors:
                    return
                if attempt == 0 and all(isinstance(e, NoScriptError) for e in errors):
                    script.sha = self._client.script_load(script.script)
                    continue
                raise errors[0]

    def renew(self, bucket: str, task_id: str, retries: int, holder: str, lease_us: int) -> bool:
        r = self._run("renew", [self._mark_key(bucket, task_id, retries)], [holder, lease_us])
        return bool(int(r))

    def pause(self, bucket: str, interval_us: int) -> Status:
        return _status(
            self._run("pause", self._control_keys(bucket), [interval_us, self._ledger_max])
        )

    def unpause(self, bucket: str, interval_us: int) -> Status:
        return _status(
            self._run("unpause", self._control_keys(bucket), [interval_us, self._ledger_max])
        )

    def set_interval(self, bucket: str, interval_us: int, new_interval_us: int) -> Status:
        return _status(
            self._run(
                "set_interval",
                self._control_keys(bucket),
                [interval_us, new_interval_us, self._ledger_max],
            )
        )

    def reset(self, bucket: str) -> None:
        self._run("reset", self._control_keys(bucket), [self._ledger_max])

    def status(self, bucket: str, interval_us: int) -> Status:
        return _status(self._run("status", [self._state_key(bucket)], [interval_us]))

    def ping(self) -> None:
        with self._errors("ping"):
            self._client.ping()

    def close(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            self._client.close()

    # -- the ledger ---------------------------------------------------------------------

    def ledger_key(self, bucket: str) -> str:
        """The key of ``bucket``'s ledger Stream (in the bucket's hash slot)."""
        return keys.ledger_key(self._prefix, keys.validate_bucket(bucket))

    def ledger(
        self, bucket: str, start_id: str = "-", count: int = 1000
    ) -> list[tuple[str, dict[str, str]]]:
        """One page of ``bucket``'s ledger, oldest first: ``(entry_id, fields)`` decoded to str.

        ``start_id`` is inclusive; pass ``"(" + last_id`` (Redis >= 6.2) for the next page.
        Fields: ``op`` and ``now`` (store real µs) always, the rest depend on ``op`` (see the
        headers of the Lua scripts). An empty list means no (more) entries.
        """
        with self._errors("ledger"):
            raw: Any = self._client.xrange(self.ledger_key(bucket), min=start_id, count=count)
        return [
            (_text(entry_id), {_text(k): _text(v) for k, v in fields.items()})
            for entry_id, fields in raw
        ]

    # -- diagnostics (plain reads, not atomic with each other) --------------------------

    def read_state(self, bucket: str) -> BucketState | None:
        """The bucket's raw state record, or None; for tests, ``status`` and debugging."""
        with self._errors("read_state"):
            raw: dict[Any, Any] = self._client.hgetall(self._state_key(bucket))
        if not raw:
            return None
        f = {_text(k): int(v) for k, v in raw.items()}
        try:
            return BucketState(
                epoch=f["e"],
                offset_us=f["o"],
                paused_at_real_us=f.get("p"),
                tat_us=f["t"],
                ticket=f["n"],
                current_slot_us=f["c"],
                last_start_us=f["l"],
                interval_override_us=f.get("i"),
            )
        except KeyError as exc:
            raise StoreError(f"interval state of bucket {bucket!r} lacks field {exc}") from None

    def read_mark(self, bucket: str, task_id: str, retries: int) -> Mark | None:
        """The stored mark of (task_id, retries), expired or not, or None."""
        with self._errors("read_mark"):
            raw: Any = self._client.get(self._mark_key(bucket, task_id, retries))
        return decode_mark(raw)

    # -- internals ----------------------------------------------------------------------

    def _state_key(self, bucket: str) -> str:
        return keys.state_key(self._prefix, keys.validate_bucket(bucket))

    def _mark_key(self, bucket: str, task_id: str, retries: int) -> str:
        return keys.mark_key(self._prefix, keys.validate_bucket(bucket), task_id, retries)

    def _control_keys(self, bucket: str) -> list[str]:
        return [self._state_key(bucket), self.ledger_key(bucket)]

    def _now_arg(self) -> str:
        return "" if self._now_us is None else str(int(self._now_us()))

    def _run(self, name: str, script_keys: list[str], args: list[str | int]) -> Any:
        """Run script ``name`` (EVALSHA, reloaded on NOSCRIPT) with the clock override first."""
        with self._errors(name):
            return self._scripts[name](keys=script_keys, args=[self._now_arg(), *args])

    @contextlib.contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        try:
            yield
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(
                f"interval store {self._where} unavailable during {op}: {exc}"
            ) from exc
        except ResponseError as exc:
            raise StoreError(f"interval store {self._where} rejected {op}: {exc}") from exc


if TYPE_CHECKING:

    def _conforms(store: RedisStore) -> Store:
        return store
