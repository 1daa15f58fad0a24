"""The pool process posts an ordinary task's done mark to the store just before its body."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from celery_interval.config import settings_of
from celery_interval.stores import DoneMark, Store, store_for_settings

logger = logging.getLogger("celery_interval")

#: One store client per (process, app): a forked pool process must not share its parent's.
_stores: dict[tuple[int, int], Store] = {}
_stores_lock = threading.Lock()


def store_of(app: Any) -> Store:
    """This process's store client for ``app`` (made on first use, without connecting)."""
    key = (os.getpid(), id(app))
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = store_for_settings(settings_of(app))
        return store


def warm(app: Any) -> None:
    """Open this process's connection for posted marks in the background, as it starts (a
    store that is down then must not hold the process up)."""

    def connect() -> None:
        with contextlib.suppress(Exception):  # prepare() says so when a task needs it
            store_of(app).prepare_post()

    threading.Thread(target=connect, name="interval-warm", daemon=True).start()


def poster(app: Any, bucket: str, task_id: str, retries: int) -> Callable[[], None] | None:
    """Before a start's wait: make the connection for the task's done mark ready, and return
    what posts the mark (None if the connection could not be made)."""
    try:
        store = store_of(app)
        store.prepare_post()
        dedupe_ttl_us = settings_of(app).dedupe_ttl_us
    except Exception as exc:
        logger.warning(
            "interval %s: task %s will start without posting its done mark: %s",
            bucket,
            task_id,
            exc,
        )
        return None
    return functools.partial(_post, store, DoneMark(bucket, task_id, retries), dedupe_ttl_us)


def _post(store: Store, mark: DoneMark, dedupe_ttl_us: int) -> None:
    """Post an ordinary task's done mark as the last spin before its start begins (at most
    ``MAX_SPIN_NS``, 0.5 ms, before the body); the worker leaves it to us.

    Celery acks an ordinary task as its start comes due, in the worker process, while the pool
    process starts the body: a worker killed in between left a message the broker gave back,
    whose copy ran again once the lease ended. With the mark posted first, that copy is a
    duplicate; and a task whose worker died before that spin began has no mark, so its copy
    runs. Posting never waits for the store, and goes out during the spin because the write
    wakes redis-server, which may take this CPU for a while (posted after the spin, it delayed
    bodies by 0.25 ms at the median). If it fails, the body starts anyway (its claim was
    granted) without a mark, as a plain Celery task runs: a copy, which exists only if the ack
    was lost too, would run again.
    """
    try:
        store.post_done(mark, dedupe_ttl_us)
    except Exception as exc:
        logger.warning(
            "interval %s: task %s starts before its done mark was sent: %s",
            mark.bucket,
            mark.task_id,
            exc,
        )
