"""The task strategy of IntervalTask: Celery's own message handling, with a slot before the pool."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from celery import signals
from celery.app import trace as _app_trace
from celery.exceptions import Retry
from celery.utils.imports import symbol_by_name
from celery.utils.saferepr import saferepr as safe_repr
from celery.worker.request import create_request_cls
from celery.worker.state import task_reserved
from celery.worker.strategy import hybrid_to_proto2, proto1_to_proto2

from celery_interval.costs import check_within_burst, message_cost
from celery_interval.errors import ConfigurationError, TransientError
from celery_interval.headers import (
    CLAIM_HEADER,
    MARK_HEADER,
    RESEND_HEADER,
    START_HEADER,
    drop_internal_headers,
)
from celery_interval.placement import Arrival, own_of, placement_of
from celery_interval.stores.base import ClaimArgs, TaskCopy
from celery_interval.throttled import Throttled
from celery_interval.worker.brokerloss import ack_through
from celery_interval.worker.consumer import service_for
from celery_interval.worker.delivery import consumed_queue, taken_back
from celery_interval.worker.held import Held
from celery_interval.worker.outage import FIRST_BACKOFF_S
from celery_interval.worker.started import missed_after_ns

__all__ = ["interval_strategy"]

logger = logging.getLogger("celery_interval.worker")


def interval_strategy(task: Any, app: Any, consumer: Any, **_: Any) -> Any:
    """Build the message handler for one IntervalTask on one (re)connected consumer."""
    service = service_for(consumer)
    hostname = consumer.hostname
    eventer = consumer.event_dispatcher
    connection_errors = consumer.connection_errors
    Req = _freeing_pool(
        create_request_cls(
            symbol_by_name(task.Request), task, consumer.pool, hostname, eventer, app=app
        ),
        lambda request: service.from_pool(_body_ended, service, request),
        lambda task_id: _accepted(service, task_id),
    )
    acks_late = bool(getattr(task, "acks_late", False))
    # kombu's Redis transport serves priority 0 first; AMQP brokers the highest number.
    lower_first = getattr(consumer.connection.transport, "driver_type", "") == "redis"

    failing = _Failing(task.name)

    def release(req: Any) -> None:
        task_reserved(req)
        consumer.on_task_request(req)

    def handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any) -> None:
        if body is None and "args" not in message.payload:
            body, headers, decoded, utc = (
                message.body,
                message.headers,
                False,
                app.uses_utc_timezone(),
            )
        elif "args" in message.payload:
            body, headers, decoded, utc = hybrid_to_proto2(message, message.payload)
        else:
            body, headers, decoded, utc = proto1_to_proto2(message, body)
        req = Req(
            message,
            on_ack=ack,
            on_reject=reject,
            app=app,
            hostname=hostname,
            eventer=eventer,
            task=task,
            connection_errors=connection_errors,
            body=body,
            headers=headers,
            decoded=decoded,
            utc=utc,
        )
        if logger.isEnabledFor(logging.INFO):
            context = {"id": req.id, "name": req.name, "args": req.argsrepr,
                       "kwargs": req.kwargsrepr, "eta": req.eta}  # fmt: skip
            logger.info(_app_trace.LOG_RECEIVED, context, extra={"data": context})
        if req.revoked():
            return
        resent = bool(req.request_dict.get(RESEND_HEADER))
        drop_internal_headers(req.request_dict)
        queue = consumed_queue(message) or _queue_of(task, req)
        arrival = Arrival(task, req.request_dict, req.args, req.kwargs, queue)
        place(message, req, arrival, callbacks, resent, 0, service.connection_losses)

    def place(
        message: Any,
        req: Any,
        arrival: Arrival,
        callbacks: Any,
        resent: bool,
        attempt: int,
        connection: int,
    ) -> None:
        if connection != service.connection_losses or req.revoked():
            return  # the message went back to the broker with its channel, or was revoked
        queue = arrival.queue
        try:
            bucket, interval_us, task_id, retries = placement_of(
                arrival, service.settings.interval_us
            )
            own, settings = own_of(task), service.settings
            burst, cost = settings.burst_of(bucket, own), message_cost(arrival)
            limits = settings.limits_of(bucket, own)
            cap = settings.concurrency_of(bucket, own)
            outer = settings.outer_of(bucket)
            check_within_burst(task.name, bucket, cost, burst, limits, outer)
        except ConfigurationError as exc:
            service.notify.received_request(req)
            _fail(req, exc)
            return
        except TransientError as exc:  # the message waits here, and tries again
            failing.failed(req.id, exc)
            delay_s = min(FIRST_BACKOFF_S * 2**attempt, service.settings.retry_max_s)
            args = (message, req, arrival, callbacks, resent, attempt + 1, connection)
            service.timer.call_after(delay_s, place, args, priority=6)
            return
        failing.passed()
        if _broadcast(message, queue):
            task_id = f"{task_id}@{hostname}"
        holder = service.new_holder()
        _track_ack(req, service, TaskCopy(bucket, task_id, retries), acks_late)
        not_before_in_us = 0
        if req.eta is not None:
            not_before_in_us = max(0, int((req.eta.timestamp() - time.time()) * 1e6))

        def release_with_callbacks(r: Any) -> None:
            for callback in callbacks or ():
                callback(r)
            release(r)

        service.receive(
            Held(
                request=req,
                bucket=bucket,
                task_id=task_id,
                retries=retries,
                queue=queue,
                interval_us=interval_us,
                not_before_in_us=not_before_in_us,
                holder=holder,
                cap=cap,
                burst=burst,
                cost=cost,
                limits=limits,
                rank=_rank((req.delivery_info or {}).get("priority"), lower_first),
                acks_late=acks_late,
                release=release_with_callbacks,
                unparked=taken_back(message) or resent,
                resent=resent,
            )
        )

    return handler


class _Failing:
    """A task's ``interval_bucket`` or ``interval_cost`` callable failing with an error that may
    pass: logged once as it starts, once as it ends (not once per message per try)."""

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name
        self.since: float | None = None

    def failed(self, task_id: str, exc: TransientError) -> None:
        if self.since is None:
            self.since = time.monotonic()
            logger.error(
                "interval: task %s waits for its placement: %s (it may pass; the worker holds "
                "such messages and tries again with backoff)",
                task_id,
                exc,
            )

    def passed(self) -> None:
        if self.since is not None:
            logger.warning(
                "interval: %s's placement works again after %.1fs",
                self.task_name,
                time.monotonic() - self.since,
            )
            self.since = None


def _freeing_pool(
    base: Any, pool_freed: Callable[[Any], None], pool_accepted: Callable[[str], None]
) -> Any:
    """The request class, telling the service when a pool process took its task and left it."""

    class Request(base):  # type: ignore[misc]
        __slots__ = ()

        def on_accepted(self, pid: Any, time_accepted: Any) -> Any:
            pool_accepted(self.id)
            return super().on_accepted(pid, time_accepted)

        def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> Any:
            try:
                return super().on_success(failed__retval__runtime, **kwargs)
            finally:
                if not failed__retval__runtime[0]:  # a failure went through on_failure
                    pool_freed(self)

        def on_failure(self, exc_info: Any, *args: Any, **kwargs: Any) -> Any:
            if _throttled(exc_info):  # its ack must not mark the copy sent again done
                self.request_dict[THROTTLED_KEY] = True
            try:
                return super().on_failure(exc_info, *args, **kwargs)
            finally:
                pool_freed(self)

    return Request


def _accepted(service: Any, task_id: str) -> None:
    """A pool process took the task (on a threads pool, in its own thread)."""
    late = service.slots.pool.accepted(task_id)
    if late is not None:
        service.from_pool(service.accepted_late, late)


def _track_ack(req: Any, service: Any, copy: TaskCopy, acks_late: bool) -> None:
    """Mirror the broker ack into a done mark; a requeue ends the lease instead.

    Celery acks an ordinary task when a pool process accepts it, which here is up to ``lead``
    before its start: the ack waits for the start deadline, so a worker killed in between
    leaves the message to the broker (its lease expires and a copy runs) instead of losing it.
    A process that takes it after the start claims a new one and may wait for it: that ack
    waits for the body's end (``ACK_AT_END_KEY``), for the same reason.
    A task released with ``MARK_HEADER`` gets its mark from the pool process, posted as the
    body starts (``worker.started``). A mark here too would cost a script call per task and add
    nothing, except where a sent ack never reached the broker: there it would drop the copy of
    a task whose body had not begun.

    Without it (a store that posts no marks: a Cluster), the mark of an ordinary task waits
    for the body's end (``_body_ended``): its pool process, reaching the task after the start
    it was admitted for, claims a new start, which a done mark would refuse as a duplicate.
    """
    on_ack, on_reject = req.on_ack, req.on_reject
    # Not req itself: closures stored on req that refer to it form a cycle, which only the
    # garbage collector frees (about 37 objects per message, and full collections).
    request_dict, message = req.request_dict, req.message

    def ack_now(*args: Any, **kwargs: Any) -> None:
        ack_through(message, lambda: on_ack(*args, **kwargs))
        if MARK_HEADER in request_dict or request_dict.get(THROTTLED_KEY):
            return
        if acks_late or request_dict.get(ENDED_KEY):
            service.mark_done(copy.bucket, copy.task_id, copy.retries)
        else:
            request_dict[PENDING_MARK_KEY] = copy

    def ack_in_loop(args: Any, kwargs: Any) -> None:
        start_ns = request_dict.get(START_HEADER)
        late_ns = time.monotonic_ns() - start_ns if isinstance(start_ns, int) else 0
        if late_ns < 0:
            service.timer.call_after(-late_ns / 1e9, ack_now, args, kwargs, priority=5)
        elif not acks_late and _reached_late(request_dict, late_ns):
            # Its pool process claims a new start and may wait for it (a pause, a throttle,
            # the store down): the message stays unacknowledged until the body ends, so a
            # worker killed meanwhile leaves it to the broker (the done mark, posted as the
            # body begins, drops the copy of a body that began).
            request_dict[ACK_AT_END_KEY] = functools.partial(ack_now, *args, **kwargs)
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


#: Set on a request whose run raised ``Throttled``: the same copy was sent again to run.
THROTTLED_KEY = "interval_throttled"
#: The copy of an acknowledged request whose done mark waits for the body's end.
PENDING_MARK_KEY = "interval_mark_at_end"
#: The ack of a task whose pool process reached it late, run when its body ends.
ACK_AT_END_KEY = "interval_ack_at_end"
#: Set on a request whose body ended.
ENDED_KEY = "interval_ended"


def _body_ended(service: Any, request: Any) -> None:
    """A pool process finished ``request`` (on the loop's thread): the ack or done mark that
    waited for it is written (no mark for a throttled run: its copy was sent again), then the
    service frees its process and place."""
    request_dict = request.request_dict
    request_dict[ENDED_KEY] = True
    deferred_ack = request_dict.pop(ACK_AT_END_KEY, None)
    if deferred_ack is not None:
        deferred_ack()
    pending = request_dict.pop(PENDING_MARK_KEY, None)
    if pending is not None and not request_dict.get(THROTTLED_KEY):
        service.mark_done(pending.bucket, pending.task_id, pending.retries)
    service.body_ended(request)


def _reached_late(request_dict: Any, late_ns: int) -> bool:
    """Whether a pool process took the task so long after its start that it claims a new one
    (``started.before_body``; half its threshold here, as the process looks a moment later)."""
    claimed = request_dict.get(CLAIM_HEADER)
    missed_ns = missed_after_ns(claimed.interval_us) if isinstance(claimed, ClaimArgs) else None
    return missed_ns is not None and late_ns > missed_ns // 2


def _throttled(exc_info: Any) -> bool:
    """Whether a run ended in the ``Retry`` that ``Throttled`` raises."""
    exc = getattr(exc_info, "exception", None)
    return isinstance(exc, Retry) and isinstance(getattr(exc, "exc", None), Throttled)


def _rank(priority: Any, lower_first: bool) -> int:
    """A message's place among those waiting in a worker: lower starts first."""
    value = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    return value if lower_first else -value


def _broadcast(message: Any, queue: str | None) -> bool:
    """Whether the message came by a Redis fanout (publish/subscribe): every worker subscribed
    gets a copy of the same message to run, and none is ever delivered again, so one worker's
    copy is not a redelivery of another's."""
    fanout_queues = getattr(getattr(message, "channel", None), "_fanout_queues", None)
    return isinstance(fanout_queues, dict) and queue in fanout_queues


def _queue_of(task: Any, req: Any) -> str | None:
    """Where no stamp says which queue a message came from: a routing key that names a queue
    of the app, else the task's own queue."""
    routing_key = (req.delivery_info or {}).get("routing_key")
    if routing_key and routing_key in req.app.amqp.queues:
        return str(routing_key)
    return getattr(task, "queue", None) or routing_key


def _fail(req: Any, exc: ConfigurationError) -> None:
    """A message we cannot place in a bucket fails visibly instead of running unlimited."""
    logger.error("interval: task %s cannot be scheduled: %s", req.id, exc)
    req.task.backend.mark_as_failure(req.id, exc, request=req._context, store_result=True)
    req.send_event("task-failed", exception=safe_repr(exc), traceback="")
    req.acknowledge()
    # As for a task that raised: error trackers and monitoring hooked to task_failure see it.
    signals.task_failure.send(
        sender=req.task,
        task_id=req.id,
        exception=exc,
        args=req.args,
        kwargs=req.kwargs,
        traceback=None,
        einfo=None,
    )
