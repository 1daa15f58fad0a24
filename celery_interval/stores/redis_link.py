"""RedisLink: a RedisStore's client, the scripts registered on it and how their calls are sent."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis
from redis.exceptions import NoPermissionError, RedisClusterException, RedisError, ResponseError
from redis.sentinel import SentinelConnectionPool

from celery_interval.errors import ConfigurationError, StoreUnavailable
from celery_interval.stores.functions import programs, supports
from celery_interval.stores.line import ScriptLine
from celery_interval.stores.posted import PostedLine
from celery_interval.stores.redis_client import codec_name, describe, store_errors
from celery_interval.stores.scripts import SCRIPT_NAMES, Named, batched, script_source

if TYPE_CHECKING:
    from celery_interval.stores.redis_client import RedisClient

__all__ = ["RedisLink"]


@dataclass(frozen=True)
class _Chosen:
    """The program of script ``name``, chosen as the call is first written: a call posted
    before the link reached the store waits for it (``PostedLine``), and so does the choice
    between functions and scripts (``functions.supports``)."""

    programs: Callable[[], dict[str, Any]]
    name: str

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.programs()[self.name], attr)


class RedisLink:
    """The way to one store: its redis-py client (made on first use when given a factory), the
    scripts registered on it, and the calls sent by script name. On a standalone Redis (or
    Sentinel's master) the scripts are one Redis Functions library, loaded at the first call
    (EVALSHA where the server has no functions: ``functions.supports``), a batch of calls goes
    back to back on one connection (``ScriptLine``) and done marks can be posted
    (``PostedLine``); on a Cluster redis-py sends each call itself by EVALSHA (node routing,
    MOVED and failover). redis-py's errors are raised as the store's
    (``errors``)."""

    def __init__(
        self, client: RedisClient | Callable[[], RedisClient], where: str | None = None
    ) -> None:
        """``client`` is a redis-py client, or a function making one on first use (a Cluster
        client connects as it is made, and a store unreachable at start must not raise here).
        ``where`` names the store in errors (default: host and port of ``client``)."""
        self._connect: Callable[[], RedisClient] | None = None
        # Any: the installed redis stubs lag redis-py (no cluster scripting, no Script.sha).
        self._live: Any = None
        self._scripts: dict[str, Any] = {}
        self._line: ScriptLine | None = None
        self._posted: PostedLine | None = None
        self._standalone = False
        self._fenced = False
        if isinstance(client, redis.Redis | redis.RedisCluster):
            self.where = where or describe(client)
            self._use(client)
        else:
            self._connect = client
            self.where = where or "<a Redis client made on first use>"

    def _use(self, client: RedisClient) -> None:
        encoding = cast(Any, client).get_encoder().encoding
        if codec_name(encoding) != "utf-8":
            raise ConfigurationError(
                f"interval store {self.where}: encoding={encoding}: the store's keys and "
                "scripts are UTF-8 (drop encoding= from the store URL)"
            )
        self._live = cast(Any, client)
        self._fenced = not isinstance(client, redis.Redis) or isinstance(
            client.connection_pool, SentinelConnectionPool
        )
        self._standalone = isinstance(client, redis.Redis)
        if self._standalone:
            self._line = ScriptLine(client)
            self._posted = PostedLine(client)
        else:
            self._scripts = {
                name: self._live.register_script(script_source(name, self._fenced))
                for name in SCRIPT_NAMES
            }

    def _programs(self) -> dict[str, Any]:
        """The scripts by name, once the client is made: on a standalone Redis, the library's
        functions, chosen at the first call (a round trip loading the library)."""
        self.client()
        scripts = self._scripts  # read once: a NOPERM in another thread may empty it
        if not scripts:
            functions = supports(self._live, self._fenced, self.where)
            scripts = self._scripts = dict(programs(self._fenced, functions))
        return scripts

    def client(self) -> Any:
        """The redis-py client, made on first use when the link was given a factory."""
        if self._live is None and self._connect is not None:
            try:
                self._use(self._connect())
            except (RedisClusterException, RedisError, OSError) as exc:
                raise StoreUnavailable(f"interval store {self.where} unavailable: {exc}") from exc
        return self._live

    def standalone(self) -> bool:
        """Whether the client is a plain redis.Redis (a single Redis or Sentinel's master), not
        a Cluster's; known once the client is made (asking makes it)."""
        self.client()
        return self._standalone

    @property
    def fenced(self) -> bool:
        """Whether a master promoted after a failover fences each state it finds
        (``schedule.fenced``): a Sentinel or Cluster store; known once the client is made."""
        self.client()
        return self._fenced

    @property
    def posts(self) -> bool:
        """Whether calls can be posted (``post``): a standalone Redis's client was made."""
        return self._posted is not None

    def errors(self, op: str) -> AbstractContextManager[None]:
        """Raise redis-py's errors during ``op`` as ``StoreUnavailable`` or ``StoreError``."""
        return store_errors(self.where, op)

    def send(self, op: str, calls: Sequence[Named]) -> list[Any]:
        """The replies of the named scripts' calls, in order (one round trip on a standalone
        Redis; a script the server lost is loaded again); the first script error raises."""
        with self.errors(op):
            scripts = self._programs()
            if self._line is not None:
                replies = self._line.run([(scripts[n], k, a) for n, k, a in calls])
            else:
                replies = [scripts[n](keys=k, args=a) for n, k, a in calls]
            for reply in replies:
                if isinstance(reply, NoPermissionError) and self._line is not None:
                    self._scripts = {}  # the ACL changed: functions or scripts, chosen again
                if isinstance(reply, ResponseError):
                    raise reply
            return replies

    def send_takes(self, calls: Sequence[Named]) -> list[Any]:
        """The replies of take calls, in order, in one round trip: on a standalone Redis runs
        of take.lua's go ``TAKES_PER_CALL`` to a take_many.lua call (``scripts.batched``); on
        a Cluster each is its own call. A script error raises after all ran."""
        with self.errors("take"):
            self.client()
            if self._line is None:
                return self.send("take", calls)
            batches = batched(calls)
            sent = self.send("take", [call for call, _grouped in batches])
            replies = [
                r
                for (_call, grouped), reply in zip(batches, sent, strict=True)
                for r in (reply if grouped else [reply])
            ]
            for reply in replies:
                if isinstance(reply, ResponseError):
                    raise reply
            return replies

    def prepare_post(self, op: str) -> None:
        """Open (or check) the connection ``post`` writes on; on a Cluster, nothing."""
        with self.errors(op):
            self._programs()
            if self._posted is not None:
                self._posted.prepare()

    def settle_post(self, op: str, timeout_s: float) -> None:
        """See that what ``post`` wrote reached the store (``PostedLine.settle``)."""
        with self.errors(op):
            if self._posted is not None:
                self._posted.settle(timeout_s)

    def post(self, op: str, call: Named) -> None:
        """Write ``call`` on the prepared connection, its reply read at the next
        ``prepare_post`` (``posts``: a standalone Redis; elsewhere nothing is sent)."""
        with self.errors(op):
            if self._posted is not None:
                name, script_keys, args = call
                program = self._scripts.get(name) or _Chosen(self._programs, name)
                self._posted.post((program, script_keys, args))

    def ping(self) -> None:
        """Reach the store, and load the scripts on the connection this thread calls with."""
        with self.errors("ping"):
            self.client().ping()
            if self._line is not None:
                self._line.load(self._programs().values())

    def close(self) -> None:
        """Return the line's connection, and close the client's."""
        if self._line is not None:
            self._line.close()
        if self._live is not None:
            with contextlib.suppress(RedisError, OSError):
                self._live.close()
