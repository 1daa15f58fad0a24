"""Store backends and ``store_from_url``, which picks one from ``interval_store_url``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from celery_interval.config.table import KEY_PREFIX, LEDGER_MAX, STORE_TIMEOUT_S
from celery_interval.errors import ConfigurationError
from celery_interval.stores.base import Store, TaskCopy
from celery_interval.stores.nested import Nesting
from celery_interval.stores.urls import StoreURL, file_directory, mask_url, parse_store_url

if TYPE_CHECKING:
    from celery_interval.config import Settings

__all__ = ["Store", "TaskCopy", "mask_url", "store_for_settings", "store_from_url"]


def store_from_url(
    url: str,
    *,
    key_prefix: str = KEY_PREFIX,
    timeout_s: float = STORE_TIMEOUT_S,
    ledger_max: int = LEDGER_MAX,
    nesting: Nesting | None = None,
) -> Store:
    """A store for ``url``: redis://, rediss://, unix:// or redis[s]+cluster:// (RedisStore),
    file:///dir, or memory://.

    ``timeout_s`` is the Redis socket timeout; ``ledger_max`` caps each bucket's ledger Stream
    at about that many entries (0 = no ledger). Both apply to RedisStore only: the file and
    memory stores ignore them (they keep no ledger). ``nesting`` gives a nested bucket's
    outer bucket (a declaration's ``outer``; the file store runs none). A malformed or unknown URL
    raises ``ConfigurationError`` naming it, password masked.
    """
    target = parse_store_url(url)
    if target.kind == "file":
        if nesting is not None:
            raise ConfigurationError(
                f"interval store URL {target.shown!r}: a file store runs no nested buckets "
                "(a declaration's outer): use a Redis store"
            )
        return _file_store(target, key_prefix)
    if target.kind == "memory":
        from celery_interval.stores.memory import MemoryStore

        return MemoryStore(nesting=nesting)
    from celery_interval.stores.redis import RedisStore

    return RedisStore.from_url(
        url,
        key_prefix=key_prefix,
        socket_timeout_s=timeout_s,
        ledger_max=ledger_max,
        nesting=nesting,
    )


def _file_store(target: StoreURL, key_prefix: str) -> Store:
    from celery_interval.stores.file import FileStore

    path = file_directory(target)
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            f"interval store URL {target.shown!r}: cannot create directory {path!r}: {exc}"
        ) from None
    return FileStore(directory, key_prefix=key_prefix)


def store_for_settings(settings: Settings) -> Store:
    """The store an app's validated settings name (URL, key prefix, timeout, ledger cap)."""
    return store_from_url(
        settings.require_store_url(),
        key_prefix=settings.key_prefix,
        timeout_s=settings.store_timeout_s,
        ledger_max=settings.ledger_max,
        nesting=settings.outer_of if settings.nested else None,
    )
