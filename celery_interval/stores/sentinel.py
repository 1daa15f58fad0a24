"""Sentinel store URLs (``redis+sentinel://``): their parts, their checks, the master's client."""

from __future__ import annotations

from typing import Any, NamedTuple, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.retry import Retry
from redis.sentinel import Sentinel

from celery_interval.errors import ConfigurationError
from celery_interval.stores.urls import SENTINEL_SCHEMES, connection_options

__all__ = ["SENTINEL_FORM", "SentinelTarget", "sentinel_client", "sentinel_target"]

#: How a Sentinel store URL is written, for error messages.
SENTINEL_FORM = "redis+sentinel://[:password@]host:port[,host:port…]/service_name[/db]"
#: A sentinel listed without a port listens on Sentinel's default port.
DEFAULT_SENTINEL_PORT = 26379
#: Query options for the sentinels themselves; every other option applies to the master.
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")


class SentinelTarget(NamedTuple):
    """A checked Sentinel URL: the sentinels, the monitored service, and the options of the
    master's connections (``connection_options`` of the equivalent ``redis://`` URL) and of
    the sentinels' connections."""

    sentinels: list[tuple[str, int]]
    service: str
    master_options: dict[str, Any]
    sentinel_options: dict[str, Any]


def sentinel_target(url: str, shown: str) -> SentinelTarget:
    """``url`` split into its parts; a bad sentinel, a missing service, a bad database or a bad
    option raises ConfigurationError naming ``shown`` (``url`` with its passwords masked)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigurationError(
            f"malformed interval store URL {shown!r}: {SENTINEL_FORM}"
        ) from None
    scheme = parts.scheme.lower()
    if scheme not in SENTINEL_SCHEMES:
        raise ConfigurationError(f"interval store URL {shown!r} is not {SENTINEL_FORM}")
    userinfo, at, hosts = parts.netloc.rpartition("@")
    sentinels = [_sentinel_node(item, shown) for item in hosts.split(",")]
    segments = [unquote(s) for s in parts.path.split("/")[1:]]
    if not segments or not segments[0]:
        raise ConfigurationError(
            f"interval store URL {shown!r} names no service: expected {SENTINEL_FORM}"
        )
    if len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
        raise ConfigurationError(
            f"interval store URL {shown!r}: expected /service_name or /service_name/db "
            f"(a database number), as in {SENTINEL_FORM}"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    sentinel_query = {k: v for k, v in query if k in _SENTINEL_OPTIONS}
    master_query = urlencode([(k, v) for k, v in query if k not in _SENTINEL_OPTIONS])
    db_path = f"/{segments[1]}" if len(segments) == 2 else ""
    # The master's options are those of the same redis:// URL, checked the same way.
    master_url = urlunsplit(
        (scheme.removesuffix("+sentinel"), f"{userinfo}{at}localhost", db_path, master_query, "")
    )
    options = dict(connection_options(master_url, shown))
    for name in ("host", "port"):
        options.pop(name, None)
    tls = options.pop("connection_class", redis.Connection) is not redis.Connection
    sentinel_options: dict[str, Any] = {
        name.removeprefix("sentinel_"): value for name, value in sentinel_query.items()
    }
    if tls:
        options["ssl"] = True  # the pool picks SentinelManagedSSLConnection
        sentinel_options["ssl"] = True
        sentinel_options.update({k: v for k, v in options.items() if k.startswith("ssl_")})
    return SentinelTarget(sentinels, segments[0], options, sentinel_options)


def _sentinel_node(item: str, shown: str) -> tuple[str, int]:
    try:
        node = urlsplit(f"//{item}")
        host, port = node.hostname, node.port
    except ValueError:
        host = port = None
    if not host or item.endswith(":"):
        raise ConfigurationError(
            f"interval store URL {shown!r}: bad sentinel {item!r}, expected {SENTINEL_FORM}"
        )
    return host, DEFAULT_SENTINEL_PORT if port is None else port


def sentinel_client(
    url: str, shown: str, timeout_s: float, retry: Retry, **client_options: Any
) -> redis.Redis:
    """A client of the master the sentinels of ``url`` name (``client_options``: the store's
    health checks): each new connection asks the sentinels where the master is, so after a
    failover the client reaches the promoted replica (a connection to the old master fails,
    or finds a replica, and is dropped). The sentinels are asked with the store's ``retry``
    too: redis-py's default backs off for seconds per sentinel, which would hold the worker's
    event loop for a minute when none answers. No I/O here."""
    target = sentinel_target(url, shown)
    timeouts = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    manager: Any = cast(Any, Sentinel)(
        target.sentinels, sentinel_kwargs={**timeouts, "retry": retry, **target.sentinel_options}
    )
    client: redis.Redis = manager.master_for(
        target.service, **{**target.master_options, **timeouts, "retry": retry, **client_options}
    )
    return client
