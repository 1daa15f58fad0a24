"""One store client per app and process, made on first use (a forked process makes its own)."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from celery_interval.config import settings_of
from celery_interval.stores import Store, store_for_settings

__all__ = ["forget_store", "store_of"]

_stores: weakref.WeakKeyDictionary[Any, tuple[int, Store]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def store_of(app: Any) -> Store:
    """This process's store client for ``app``'s settings (made without connecting)."""
    pid = os.getpid()
    with _lock:
        made = _stores.get(app)
        if made is None or made[0] != pid:
            made = _stores[app] = (pid, store_for_settings(settings_of(app)))
        return made[1]


def forget_store(app: Any) -> None:
    """Drop this process's store client for ``app`` (after its store settings changed)."""
    with _lock:
        made = _stores.pop(app, None)
    if made is not None and made[0] == os.getpid():
        made[1].close()
