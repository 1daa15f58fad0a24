"""Store URLs: which scheme names which store, their checks, cluster seeds, masked passwords."""

from __future__ import annotations

import os
import re
from typing import Any, Literal, NamedTuple, TypeGuard, cast
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import redis
from redis.cluster import ClusterNode
from redis.connection import parse_url
from redis.exceptions import RedisError

from celery_interval.errors import ConfigurationError

__all__ = [
    "CLUSTER_SCHEMES",
    "REDIS_SCHEMES",
    "SENTINEL_SCHEMES",
    "STORE_URL_FORMS",
    "RedisKind",
    "StoreKind",
    "StoreURL",
    "cluster_seeds",
    "connection_options",
    "file_directory",
    "is_redis_broker_url",
    "is_redis_url",
    "is_sentinel_url",
    "mask_url",
    "parse_store_url",
    "redis_kind",
]

#: URL schemes of a standalone Redis (TCP, TLS, a Unix socket).
REDIS_SCHEMES = ("redis", "rediss", "unix")
#: URL schemes of a Redis Cluster (the ``+cluster`` convention of limits, go-redis and others).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
#: URL schemes of a master watched by Redis Sentinel (``limits``' ``+sentinel`` convention).
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Every form of store URL, for error messages.
STORE_URL_FORMS = (
    "redis://host:6379/0, rediss://…, unix:///path.sock, redis+cluster://host:port[,host:port…], "
    "rediss+cluster://…, redis+sentinel://host:port[,host:port…]/service_name[/db], "
    "rediss+sentinel://…, file:///shared/dir or memory://"
)

#: Which store a URL names: RedisStore (standalone, Cluster or Sentinel), FileStore or
#: MemoryStore.
StoreKind = Literal["redis", "cluster", "sentinel", "file", "memory"]
#: The kinds of store a RedisStore serves.
RedisKind = Literal["redis", "cluster", "sentinel"]

_QUERY_PASSWORD = re.compile(r"(?i)([?&](?:sentinel_)?password=)[^&#]*")
#: Broker URLs whose Redis is the store when ``interval_store_url`` is unset.
_REDIS_BROKER_PREFIXES = ("redis://", "rediss://")
#: URL query options that name a file (checked when the store is made, not at first use).
_TLS_FILE_OPTIONS = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")


class StoreURL(NamedTuple):
    """A store URL checked by ``parse_store_url``: the URL, the same masked, its kind, parts."""

    url: str
    shown: str
    kind: StoreKind
    parts: SplitResult


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (works even on an unparsable URL)."""
    url = _QUERY_PASSWORD.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    userinfo, at, host_and_path = rest.rpartition("@")
    if not sep or not at or userinfo.startswith("/") or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host_and_path}"


def parse_store_url(url: object) -> StoreURL:
    """``url`` with the kind of store its scheme names; a malformed or unknown URL raises
    ``ConfigurationError`` naming it, password masked."""
    if not isinstance(url, str):
        raise ConfigurationError(
            f"interval store URL {url!r} must be a string like {STORE_URL_FORMS}, "
            f"not {type(url).__name__}"
        )
    shown = mask_url(url)
    try:
        parts = urlsplit(url)
        if parts.scheme.lower() not in CLUSTER_SCHEMES + SENTINEL_SCHEMES:  # checked per node
            parts.port  # noqa: B018 — urlsplit checks the port only when it is read
    except ValueError:
        # The parser's own message may quote part of a password: name the URL masked instead.
        raise ConfigurationError(
            f"malformed interval store URL {shown!r}: bad host or port (e.g. redis://host:6379/0)"
        ) from None
    scheme = parts.scheme.lower()
    kind = _kind_of(scheme)
    if kind is None:
        why = "has no scheme" if not scheme else f"has unknown scheme {scheme!r}"
        raise ConfigurationError(f"interval store URL {shown!r} {why}: use {STORE_URL_FORMS}")
    if kind in ("redis", "cluster", "sentinel") and "://" not in url:
        raise ConfigurationError(f"malformed interval store URL {shown!r}: expected {scheme}://")
    return StoreURL(url, shown, kind, parts)


def _kind_of(scheme: str) -> StoreKind | None:
    if scheme in REDIS_SCHEMES:
        return "redis"
    if scheme in CLUSTER_SCHEMES:
        return "cluster"
    if scheme in SENTINEL_SCHEMES:
        return "sentinel"
    if scheme == "file":
        return "file"
    if scheme == "memory":
        return "memory"
    return None


def file_directory(target: StoreURL) -> str:
    """The absolute directory a ``file:///dir`` URL names."""
    url, shown, parts = target.url, target.shown, target.parts
    if not url.lower().startswith("file://") or parts.netloc not in ("", "localhost"):
        raise ConfigurationError(
            f"interval store URL {shown!r}: expected file:///absolute/dir (three slashes)"
        )
    path = unquote(parts.path)
    if not path.startswith("/") or not path.strip("/"):
        raise ConfigurationError(
            f"interval store URL {shown!r} names no directory: expected file:///absolute/dir"
        )
    return path


def redis_kind(url: str, shown: str) -> RedisKind:
    """Whether ``url`` names a standalone Redis, a Redis Cluster or a Sentinel-watched master;
    ConfigurationError if none (``shown`` is ``url`` masked, for the message)."""
    try:
        scheme = urlsplit(url).scheme.lower()
    except ValueError as exc:
        raise ConfigurationError(f"malformed interval store URL {shown!r}: {exc}") from None
    kind = _kind_of(scheme)
    if kind != "redis" and kind != "cluster" and kind != "sentinel":
        raise ConfigurationError(
            f"interval store URL {shown!r} must start with redis://, rediss://, unix://, "
            "redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"
        )
    return kind


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a standalone Redis (redis://, rediss://, unix://)."""
    return urlsplit(url).scheme.lower() in REDIS_SCHEMES


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names a master watched by Redis Sentinel (redis[s]+sentinel://)."""
    return urlsplit(url).scheme.lower() in SENTINEL_SCHEMES


def is_redis_broker_url(url: object) -> TypeGuard[str]:
    """Whether a Celery broker URL is a Redis that can also serve as the store."""
    return isinstance(url, str) and url.startswith(_REDIS_BROKER_PREFIXES)


def connection_options(url: str, shown: str) -> dict[str, Any]:
    """The options ``url`` gives each connection, checked by building one (no I/O): a misspelt
    option, a bad value or a missing TLS file raises ConfigurationError here, not at first use."""
    try:
        options: dict[str, Any] = cast(Any, parse_url)(url)
    except ValueError as exc:
        raise ConfigurationError(f"malformed interval store URL {shown!r}: {exc}") from None
    for name in _TLS_FILE_OPTIONS:
        path = options.get(name)
        if path is not None and not os.path.exists(path):
            raise ConfigurationError(
                f"interval store URL {shown!r}: {name} {path!r} does not exist"
            )
    built = dict(options)
    connection_class = built.pop("connection_class", redis.Connection)
    try:
        connection_class(**built)
    except (TypeError, ValueError, RedisError) as exc:
        raise ConfigurationError(f"interval store URL {shown!r}: bad option: {exc}") from None
    return options


def cluster_seeds(url: str, shown: str) -> tuple[str, list[ClusterNode]]:
    """``redis+cluster://u:p@h1:1,h2:2/0?o`` → (``redis://u:p@h1:1/0?o``, the seed nodes)."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    nodes = []
    for item in hosts.split(","):
        try:
            node = urlsplit(f"//{item}")
            host, port = node.hostname, node.port
        except ValueError:
            host = port = None
        if not host or port is None:
            raise ConfigurationError(
                f"interval store URL {shown!r}: bad cluster node {item!r}, expected "
                "redis+cluster://host:port[,host:port…]"
            )
        nodes.append(cast(Any, ClusterNode)(host, port))
    scheme = parts.scheme.lower().removesuffix("+cluster")
    seed = urlunsplit((scheme, userinfo + at + hosts.split(",")[0], parts.path, parts.query, ""))
    if connection_options(seed, shown).get("db", 0) != 0:
        raise ConfigurationError(
            f"interval store URL {shown!r}: a Redis Cluster has only database 0"
        )
    return seed, nodes
