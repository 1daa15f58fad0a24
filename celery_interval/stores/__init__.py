"""Store backends and ``store_from_url``, which picks one from ``interval_store_url``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from celery_interval.defaults import KEY_PREFIX, LEDGER_MAX, STORE_TIMEOUT_S
from celery_interval.errors import ConfigurationError

if TYPE_CHECKING:
    from celery_interval.config import Settings
from celery_interval.stores.base import Store, TaskCopy

__all__ = ["Store", "TaskCopy", "mask_url", "store_for_settings", "store_from_url"]

_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&#]*")
_SCHEMES = (
    "redis://host:6379/0, rediss://…, unix:///path.sock, redis+cluster://host:port[,host:port…], "
    "rediss+cluster://…, file:///shared/dir or memory://"
)
#: URL schemes of a Redis Cluster (the ``+cluster`` convention of limits, go-redis and others).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (works even on an unparsable URL)."""
    url = _QUERY_PASSWORD.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    userinfo, at, host_and_path = rest.rpartition("@")
    if not sep or not at or userinfo.startswith("/") or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host_and_path}"


def store_from_url(
    url: str,
    *,
    key_prefix: str = KEY_PREFIX,
    timeout_s: float = STORE_TIMEOUT_S,
    ledger_max: int = LEDGER_MAX,
) -> Store:
    """A store for ``url``: redis://, rediss://, unix:// or redis[s]+cluster:// (RedisStore),
    file:///dir, or memory://.

    ``timeout_s`` is the Redis socket timeout; ``ledger_max`` caps each bucket's ledger Stream
    at about that many entries (0 = no ledger). Both apply to RedisStore only: the file and
    memory stores ignore them (they keep no ledger). A malformed or unknown URL raises
    ``ConfigurationError`` naming it, password masked.
    """
    if not isinstance(url, str):
        raise ConfigurationError(
            f"interval store URL {url!r} must be a string like {_SCHEMES}, not {type(url).__name__}"
        )
    shown = mask_url(url)
    try:
        parts = urlsplit(url)
        if parts.scheme.lower() not in CLUSTER_SCHEMES:  # host:port,host:port: checked per node
            parts.port  # noqa: B018 — urlsplit checks the port only when it is read
    except ValueError:
        # The parser's own message may quote part of a password: name the URL masked instead.
        raise ConfigurationError(
            f"malformed interval store URL {shown!r}: bad host or port (e.g. redis://host:6379/0)"
        ) from None
    scheme = parts.scheme.lower()
    if scheme in ("redis", "rediss", "unix", *CLUSTER_SCHEMES):
        if "://" not in url:
            raise ConfigurationError(
                f"malformed interval store URL {shown!r}: expected {scheme}://"
            )
        from celery_interval.stores.redis import RedisStore

        return RedisStore.from_url(
            url, key_prefix=key_prefix, socket_timeout_s=timeout_s, ledger_max=ledger_max
        )
    if scheme == "file":
        return _file_store(url, shown, parts.netloc, parts.path, key_prefix)
    if scheme == "memory":
        from celery_interval.stores.memory import MemoryStore

        return MemoryStore()
    why = "has no scheme" if not scheme else f"has unknown scheme {scheme!r}"
    raise ConfigurationError(f"interval store URL {shown!r} {why}: use {_SCHEMES}")


def _file_store(url: str, shown: str, netloc: str, raw_path: str, key_prefix: str) -> Store:
    from celery_interval.stores.file import FileStore

    if not url.lower().startswith("file://") or netloc not in ("", "localhost"):
        raise ConfigurationError(
            f"interval store URL {shown!r}: expected file:///absolute/dir (three slashes)"
        )
    path = unquote(raw_path)
    if not path.startswith("/") or not path.strip("/"):
        raise ConfigurationError(
            f"interval store URL {shown!r} names no directory: expected file:///absolute/dir"
        )
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"interval store URL {shown!r}: cannot create directory {path!r}: {exc}"
        ) from None
    return FileStore(directory, key_prefix=key_prefix)


def store_for_settings(settings: Settings) -> Store:
    """The store an app's validated settings name (URL, key prefix, timeout, ledger cap)."""
    return store_from_url(
        settings.store_url,
        key_prefix=settings.key_prefix,
        timeout_s=settings.store_timeout_s,
        ledger_max=settings.ledger_max,
    )
