"""The task strategy of IntervalTask: Celery's own message handling, with a slot before the pool."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from celery import signals
from celery.app import trace as _app_trace
from celery.utils.imports import symbol_by_name
from celery.utils.saferepr import saferepr as safe_repr
from celery.worker.request import create_request_cls
from celery.worker.state import task_reserved
from celery.worker.strategy import hybrid_to_proto2, proto1_to_proto2

from celery_interval.costs import check_within_burst, message_cost
from celery_interval.errors import ConfigurationError, TransientError
from celery_interval.headers import (
    RESEND_HEADER,
    drop_internal_headers,
)
from celery_interval.placement import Arrival, own_of, placement_of
from celery_interval.stores.base import TaskCopy
from celery_interval.worker.acks import THROTTLED_KEY, body_ended, throttled_run, track_ack
from celery_interval.worker.broker.delivery import consumed_queue, taken_back
from celery_interval.worker.consumer import service_for
from celery_interval.worker.held import Held
from celery_interval.worker.store.outage import FIRST_BACKOFF_S

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
        lambda request: service.from_pool(body_ended, service, request),
        lambda task_id: _accepted(service, task_id),
    )

    def release(req: Any) -> None:
        task_reserved(req)
        consumer.on_task_request(req)

    placing = _Placing(
        task=task,
        service=service,
        hostname=hostname,
        acks_late=bool(getattr(task, "acks_late", False)),
        # kombu's Redis transport serves priority 0 first; AMQP brokers the highest number.
        lower_first=getattr(consumer.connection.transport, "driver_type", "") == "redis",
        failing=_Failing(task.name),
        release=release,
    )

    def handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any) -> None:
        body, headers, decoded, utc = _proto2(app, message, body)
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
        delivery = _Delivery(message, req, arrival, callbacks, resent, service.connection_losses)
        placing.place(delivery, 0)

    return handler


def _proto2(app: Any, message: Any, body: Any) -> tuple[Any, Any, bool, bool]:
    """A message's body, headers, whether the body is decoded, and utc, in protocol 2 (as
    Celery's default strategy reads them)."""
    if body is None and "args" not in message.payload:
        return message.body, message.headers, False, app.uses_utc_timezone()
    if "args" in message.payload:
        return hybrid_to_proto2(message, message.payload)  # type: ignore[no-any-return]
    return proto1_to_proto2(message, body)  # type: ignore[no-any-return]


class _Delivery(NamedTuple):
    """One received message on its way to the service: the request Celery made of it, what
    places it, and the connection it came on (it went back to the broker if that closed)."""

    message: Any
    req: Any
    arrival: Arrival
    callbacks: Any
    resent: bool
    connection: int


@dataclass
class _Placing:
    """Places one task's messages: their bucket and limits, then a ``Held`` for the service.
    A placement that fails with a ``TransientError`` (a user's ``interval_bucket`` or cost
    function) waits here and tries again with backoff; a ``ConfigurationError`` fails the task."""

    task: Any
    service: Any
    hostname: str
    acks_late: bool
    lower_first: bool
    failing: _Failing
    release: Callable[[Any], None]

    def place(self, delivery: _Delivery, attempt: int) -> None:
        service, req = self.service, delivery.req
        if delivery.connection != service.connection_losses or req.revoked():
            return  # the message went back to the broker with its channel, or was revoked
        try:
            bucket, interval_us, task_id, retries = placement_of(
                delivery.arrival, service.settings.interval_us
            )
            own, settings = own_of(self.task), service.settings
            burst, cost = settings.burst_of(bucket, own), message_cost(delivery.arrival)
            limits = settings.limits_of(bucket, own)
            cap = settings.concurrency_of(bucket, own)
            outer = settings.outer_of(bucket)
            check_within_burst(self.task.name, bucket, cost, burst, limits, outer)
        except ConfigurationError as exc:
            service.notify.received_request(req)
            _fail(req, exc)
            return
        except TransientError as exc:  # the message waits here, and tries again
            self.failing.failed(req.id, exc)
            delay_s = min(FIRST_BACKOFF_S * 2**attempt, service.settings.retry_max_s)
            service.timer.call_after(delay_s, self.place, (delivery, attempt + 1), priority=6)
            return
        self.failing.passed()
        message, queue = delivery.message, delivery.arrival.queue
        if _broadcast(message, queue):
            task_id = f"{task_id}@{self.hostname}"
        track_ack(req, service, TaskCopy(bucket, task_id, retries), self.acks_late)
        not_before_in_us = 0
        if req.eta is not None:
            not_before_in_us = max(0, int((req.eta.timestamp() - time.time()) * 1e6))

        def release_with_callbacks(r: Any) -> None:
            for callback in delivery.callbacks or ():
                callback(r)
            self.release(r)

        service.receive(
            Held(
                request=req,
                bucket=bucket,
                task_id=task_id,
                retries=retries,
                queue=queue,
                interval_us=interval_us,
                not_before_in_us=not_before_in_us,
                holder=service.new_holder(),
                cap=cap,
                burst=burst,
                cost=cost,
                limits=limits,
                rank=_rank((req.delivery_info or {}).get("priority"), self.lower_first),
                acks_late=self.acks_late,
                release=release_with_callbacks,
                unparked=taken_back(message) or delivery.resent,
                resent=delivery.resent,
            )
        )


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
            throttled = throttled_run(exc_info)
            if throttled:  # its ack must not mark the copy sent again done
                self.request_dict[THROTTLED_KEY] = throttled
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
