"""Acks of interval tasks' messages: when each goes to the broker, and the done mark with it."""

from __future__ import annotations

import functools
import time
from typing import Any

from celery.exceptions import Retry

from celery_interval.config import Settings
from celery_interval.headers import CLAIM_HEADER, MARK_HEADER, START_HEADER, STORE_START_HEADER
from celery_interval.stores.base import ClaimArgs, TaskCopy
from celery_interval.throttled import Throttled
from celery_interval.worker.broker.brokerloss import ack_through
from celery_interval.worker.process.started import missed_after_ns

__all__ = ["DROPPED_KEY", "SENT_PLAIN", "THROTTLED_KEY", "body_ended", "throttled_run", "track_ack"]


#: Set on a request whose run raised ``Throttled``: the same copy was sent again to run
#: (``SENT_PLAIN`` when it went as a plain copy, its place not kept).
THROTTLED_KEY = "interval_throttled"
SENT_PLAIN = "sent plain"
#: The copy of an acknowledged request whose done mark waits for the body's end.
PENDING_MARK_KEY = "interval_mark_at_end"
#: The ack of a task whose pool process reached it late, run when its body ends.
ACK_AT_END_KEY = "interval_ack_at_end"
#: Set on a request whose body ended.
ENDED_KEY = "interval_ended"
#: The copy of an acknowledged request remembered as begun here, until its body ends.
BEGAN_KEY = "interval_began"
#: Set on a request acknowledged as a duplicate copy, whose body never runs here.
DROPPED_KEY = "interval_dropped"


def body_ended(service: Any, request: Any) -> None:
    """A pool process finished ``request`` (on the loop's thread): the ack or done mark that
    waited for it is written (no mark for a throttled run: its copy was sent again), then the
    service frees its process and place."""
    request_dict = request.request_dict
    request_dict[ENDED_KEY] = True
    throttled = request_dict.get(THROTTLED_KEY)
    deferred_ack = request_dict.pop(ACK_AT_END_KEY, None)
    if deferred_ack is not None:
        waited = service.done.ack_went(request_dict.get("id"))
        if waited is not None and throttled == SENT_PLAIN:
            service.done.forget(waited)  # its mark may have been read as the channel broke
        deferred_ack()
    pending = request_dict.pop(PENDING_MARK_KEY, None)
    if pending is not None and not throttled:
        service.mark_done(pending.bucket, pending.task_id, pending.retries)
    began = request_dict.pop(BEGAN_KEY, None)
    if began is not None and not throttled:
        service.done.ended(began)
    elif began is not None and throttled == SENT_PLAIN:
        service.done.forget(began)  # that copy carries no resend header: it must not drop
    service.body_ended(request)


def reached_late(request_dict: Any, late_ns: int, settings: Settings) -> bool:
    """Whether a pool process took the task so long after its start that it claims a new one
    (``started.before_body``; half its threshold here, as the process looks a moment later)."""
    claimed = request_dict.get(CLAIM_HEADER)
    if not isinstance(claimed, ClaimArgs):
        return False
    missed_ns = missed_after_ns(settings.pace_us(claimed.bucket, claimed.interval_us))
    return missed_ns is not None and late_ns > missed_ns // 2


def throttled_run(exc_info: Any) -> bool | str:
    """Whether a run ended in the ``Retry`` that ``Throttled`` raises: ``SENT_PLAIN`` when its
    copy went again as a plain message (the store could not keep its place), else a bool."""
    exc = getattr(exc_info, "exception", None)
    cause = getattr(exc, "exc", None)
    if not isinstance(exc, Retry) or not isinstance(cause, Throttled):
        return False
    return True if cause.place_kept else SENT_PLAIN


def track_ack(req: Any, service: Any, copy: TaskCopy, acks_late: bool) -> None:
    """Mirror the broker ack into a done mark; a requeue ends the lease instead.

    Celery acks an ordinary task when a pool process accepts it, which here is up to ``lead``
    before its start: the ack waits for the start deadline, so a worker killed in between
    leaves the message to the broker (its lease expires and a copy runs) instead of losing it.
    A process that takes it after the start claims a new one and may wait for it: that ack
    waits for the body's end (``ACK_AT_END_KEY``), for the same reason.
    A task released with ``MARK_HEADER`` gets its mark from the pool process, posted as the
    body starts (``worker.process.started``). A mark here too would cost a script call per
    task and add nothing, except where a sent ack never reached the broker: there it would
    drop the copy of a task whose body had not begun.

    Without it (a store that posts no marks: a Cluster), the mark of an ordinary task waits
    for the body's end (``body_ended``): its pool process, reaching the task after the start
    it was admitted for, claims a new start, which a done mark would refuse as a duplicate.
    """
    on_ack, on_reject = req.on_ack, req.on_reject
    # Not req itself: closures stored on req that refer to it form a cycle, which only the
    # garbage collector frees (about 37 objects per message, and full collections).
    request_dict, message = req.request_dict, req.message

    def ack_now(*args: Any, **kwargs: Any) -> None:
        ack_through(message, lambda: on_ack(*args, **kwargs))
        _acked(service, request_dict, copy, acks_late)

    def ack_in_loop(args: Any, kwargs: Any) -> None:
        start_ns = request_dict.get(START_HEADER)
        late_ns = time.monotonic_ns() - start_ns if isinstance(start_ns, int) else 0
        if late_ns < 0:
            service.timer.call_after(-late_ns / 1e9, ack_now, args, kwargs, priority=5)
        elif not acks_late and reached_late(request_dict, late_ns, service.settings):
            # Its pool process claims a new start and may wait for it (a pause, a throttle,
            # the store down): the message stays unacknowledged until the body ends, so a
            # worker killed meanwhile leaves it to the broker (the done mark, posted as the
            # body begins, drops the copy of a body that began).
            request_dict[ACK_AT_END_KEY] = functools.partial(ack_now, *args, **kwargs)
            service.done.acks_wait(request_dict.get("id"), copy)
        else:
            ack_now(*args, **kwargs)

    def reject_in_loop(log: Any, errors: Any, requeue: bool) -> None:
        if requeue:  # the lease ends before the broker can hand the message out again
            service.leases.end(copy.bucket, copy.task_id, copy.retries)
            on_reject(log, errors, requeue)
        else:
            on_reject(log, errors, requeue)
            service.mark_done(copy.bucket, copy.task_id, copy.retries)

    def ack(*args: Any, **kwargs: Any) -> None:
        service.from_pool(ack_in_loop, args, kwargs)

    def reject(log: Any, errors: Any, requeue: bool = False) -> None:
        service.from_pool(reject_in_loop, log, errors, requeue)

    req._on_ack = ack
    req.on_reject = reject


def _acked(service: Any, request_dict: Any, copy: TaskCopy, acks_late: bool) -> None:
    """The broker ack of ``copy`` went: remember that its body began here, and write its done
    mark now (an acks_late task, a body that ended), or at the body's end (``body_ended``),
    or not at all (a pool process posts it: ``MARK_HEADER``; a throttled run's copy was sent
    again). A duplicate copy's ack records nothing: no body of it ran here, and a body of the
    same task that did is remembered already, with its end."""
    if request_dict.get(THROTTLED_KEY) or request_dict.get(DROPPED_KEY):
        return
    ended = bool(acks_late or request_dict.get(ENDED_KEY))
    start_us = request_dict.get(STORE_START_HEADER)
    service.done.began(copy, ended=ended, start_us=start_us if isinstance(start_us, int) else None)
    if not ended:
        request_dict[BEGAN_KEY] = copy
    if MARK_HEADER in request_dict:
        return
    if ended:
        service.mark_done(copy.bucket, copy.task_id, copy.retries)
    else:
        request_dict[PENDING_MARK_KEY] = copy
