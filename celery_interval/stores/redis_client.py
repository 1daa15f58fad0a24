"""redis-py clients for a store URL: timeouts, retry, health checks, Cluster clients."""

from __future__ import annotations

import codecs
import contextlib
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any, TypeAlias

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from celery_interval.config.table import HEALTH_CHECK_INTERVAL_S
from celery_interval.errors import StoreError, StoreRefused, StoreUnavailable
from celery_interval.stores.sentinel import sentinel_client
from celery_interval.stores.urls import cluster_seeds, connection_options, redis_kind

__all__ = [
    "RedisClient",
    "client_for_url",
    "cluster_client",
    "codec_name",
    "describe",
    "refused_for_now",
    "store_errors",
]

RedisClient: TypeAlias = "redis.Redis | redis.RedisCluster"

#: Errors meaning "the store cannot be reached right now": held tasks are retried later.
_UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisConnectionError,  # includes BusyLoadingError and AuthenticationError
    RedisTimeoutError,
    BusyLoadingError,
    ClusterDownError,  # includes MasterDownError
    TryAgainError,
    ReadOnlyError,  # a failover left us talking to a replica
)


#: Error replies that pass (by themselves, or once an operator frees memory, fixes the disk or
#: grants the command): Redis refuses these before a script's first write (a script that wrote
#: runs to its end), so the call changed nothing and is sent again later, as in an outage.
_REFUSED_FOR_NOW: tuple[type[Exception], ...] = (OutOfMemoryError, NoPermissionError)
#: The same by error code: at the start of the reply, or where a command inside a script
#: (called from one of its functions) was refused: "Error running script …: -OOM command …".
#: An ACL refusal of a key inside a script comes without its NOPERM code.
_REFUSED_CODES = re.compile(
    r"(?:^|: -)(?:OOM|MISCONF|NOPERM|BUSY|NOREPLICAS|READONLY|LOADING|MASTERDOWN|TRYAGAIN"
    r"|CLUSTERDOWN) |The user executing the script can't access"
)


def refused_for_now(exc: ResponseError) -> bool:
    """Whether an error reply is the store's state, not the call's: retried, where any other
    (a Lua error in a script, WRONGTYPE on a damaged key) is a bug that retrying will not cure."""
    return isinstance(exc, _REFUSED_FOR_NOW) or _REFUSED_CODES.search(str(exc)) is not None


@contextlib.contextmanager
def store_errors(where: str, op: str) -> Iterator[None]:
    """Raise redis-py's errors during ``op`` on the store ``where`` as ``StoreUnavailable``
    (held tasks are retried later; ``StoreRefused`` for an error reply that passes) or
    ``StoreError`` (the store refused the call: a bug, or a damaged key)."""
    try:
        yield
    except AuthenticationError as exc:
        raise StoreUnavailable(
            f"interval store {where} refused the login during {op} "
            f"(check the user and password of the store URL): {exc}"
        ) from exc
    except _UNAVAILABLE as exc:
        raise StoreUnavailable(f"interval store {where} unavailable during {op}: {exc}") from exc
    except ResponseError as exc:
        if refused_for_now(exc):
            raise StoreRefused(f"interval store {where} refused {op} for now: {exc}") from exc
        raise StoreError(f"interval store {where} rejected {op}: {exc}") from exc


def client_for_url(
    url: str, shown: str, timeout_s: float
) -> redis.Redis | Callable[[], redis.RedisCluster]:
    """A client for a redis://, rediss://, unix:// or redis[s]+sentinel:// URL, or for a cluster
    URL a function making one (a Cluster client connects as it is made). A bad URL or option
    raises ConfigurationError naming ``shown`` (the URL, password masked)."""
    kind = redis_kind(url, shown)
    if kind == "cluster":
        seed, nodes = cluster_seeds(url, shown)
        return functools.partial(cluster_client, seed, nodes, timeout_s)
    if kind == "sentinel":
        return sentinel_client(
            url,
            shown,
            timeout_s,
            health_check_interval=HEALTH_CHECK_INTERVAL_S,
            retry=_quick_retry(),
        )
    connection_options(url, shown)
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
        # One quick retry covers a pooled connection the server closed; longer outages
        # surface as StoreUnavailable and the caller holds its tasks and backs off.
        retry=_quick_retry(),
    )


def cluster_client(seed: str, nodes: list[ClusterNode], timeout_s: float) -> redis.RedisCluster:
    """A RedisCluster client; it asks the seeds for the slot map as it is made."""
    return redis.RedisCluster(
        url=seed,
        startup_nodes=nodes[1:],  # the seed URL adds the first
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=_quick_retry(),
    )


def _quick_retry() -> Retry:
    return Retry(ExponentialBackoff(cap=0.1, base=0.01), 1)


def codec_name(encoding: str) -> str:
    """The canonical name of ``encoding`` (``utf8`` → ``utf-8``), or ``encoding`` if unknown."""
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        return encoding


def describe(client: RedisClient) -> str:
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
