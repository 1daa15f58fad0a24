"""A throttled run, in the pool process: defer the bucket, keep the task's place, send it again."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, NoReturn

from celery.exceptions import Retry

from celery_interval.app_store import store_of
from celery_interval.config import settings_of
from celery_interval.errors import StoreError
from celery_interval.headers import (
    BUCKET_HEADER,
    CLAIM_HEADER,
    COST_HEADER,
    RESEND_HEADER,
    SEND_HEADER,
)
from celery_interval.placement import own_of
from celery_interval.schedule import Backoff
from celery_interval.stores.base import ClaimArgs
from celery_interval.throttled import Throttled
from celery_interval.worker.process.resend import connected_producer, until_sent

__all__ = ["throttled"]

#: The headers of the message that its copy sent again keeps.
KEPT_HEADERS = (SEND_HEADER, BUCKET_HEADER, COST_HEADER)

logger = logging.getLogger("celery_interval.worker")


def throttled(task: Any, exc: Throttled) -> NoReturn:
    """``task``'s body raised ``exc``: no start of its bucket for ``exc.retry_after_s``, its
    place kept in the store, the same message (same task id, retries and send code) published
    again; the run ends in Celery's RETRY state (``Retry``), with no retry spent.

    With the store unreachable, or answering an error, nothing can be deferred or kept: the
    task is sent again as a new message (a new send, with its own code) with a countdown of
    the wait (a plain retry that spends no retry either).
    """
    request = task.request
    claimed = request.get(CLAIM_HEADER)
    if not isinstance(claimed, ClaimArgs):  # not started through a slot (apply(), eager)
        raise exc
    kept = {name: request.get(name) for name in KEPT_HEADERS if request.get(name) is not None}
    options: dict[str, Any] = {}
    if _deferred(task, claimed, exc):
        kept[RESEND_HEADER] = True
    else:
        options["countdown"] = exc.retry_after_s
        exc.place_kept = False
    sig = task.signature_from_request(request, retries=request.retries, **options)
    headers = {**(sig.options.get("headers") or {}), **kept}
    if not exc.place_kept:
        # A new send with its own code: the run's done mark, posted as its body began, drops
        # copies of the old send, even one sent to run once per task id.
        headers.pop(SEND_HEADER, None)
    sig.set(headers=headers)
    policy = until_sent(f"interval {claimed.bucket}: throttled", request.id)
    with connected_producer(task.app, policy) as producer:
        sig.apply_async(producer=producer, retry=True, retry_policy=policy)
    raise Retry(str(exc), exc=exc, when=exc.retry_after_s, sig=sig)


def _deferred(task: Any, claimed: ClaimArgs, exc: Throttled) -> bool:
    """Defer ``claimed``'s bucket by ``exc``'s wait, the task keeping its place; False when the
    store is unreachable or answers an error (each logged in one line)."""
    store = store_of(task.app)
    try:
        with contextlib.suppress(StoreError):
            store.prepare_post()  # a done mark posted as the body began lands first
        adapt_max_us = settings_of(task.app).adapt_max_us(
            claimed.bucket, claimed.interval_us, own_of(task)
        )
        backoff = Backoff(
            exc.retry_after_us,
            claimed.ticket,
            adapt_max_us,
            claimed.burst,
            claimed.cost,
            claimed.limits,
        )
        status = store.throttle(claimed.copy, claimed.interval_us, backoff)
    except StoreError as outage:
        logger.warning(
            "interval %s: task %s throttled (%s) with the store failing (%s): sent again "
            "to run in %.3fs, the bucket not deferred",
            claimed.bucket,
            task.request.id,
            exc,
            outage,
            exc.retry_after_s,
        )
        return False
    logger.warning(
        "interval %s: task %s throttled (%s): no start of the bucket for %.3fs, it keeps "
        "its place (ticket %d); interval %gs%s",
        claimed.bucket,
        task.request.id,
        exc,
        exc.retry_after_s,
        claimed.ticket,
        status.interval_us / 1e6,
        " (adapted)" if status.adapted else "",
    )
    return True
