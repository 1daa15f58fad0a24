"""What a worker tells onlookers about its interval tasks: Celery events and signals."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from celery import signals as celery_signals

from celery_interval import signals
from celery_interval.buckets import queue_of
from celery_interval.schedule import Outcome
from celery_interval.worker.held import Held

__all__ = ["EVENT_GROUP", "Notify", "iso_of"]

logger = logging.getLogger("celery_interval.worker")

#: The group of the events below (``interval-granted`` …): they go wherever task events go.
EVENT_GROUP = "interval"


def iso_of(wall_s: float | None) -> str | None:
    """A Unix time as the ISO 8601 UTC string Celery's events use for ``eta``."""
    return None if wall_s is None else _utc(wall_s).isoformat()


class Notify:
    """Sends ``task-received`` as Celery's strategy does (once per delivery, with the slot as
    its ``eta`` when it is known), ``interval-granted`` / ``interval-claimed`` /
    ``interval-<action>`` events when the worker sends task events, and this package's signals.
    """

    def __init__(self, eventer: Callable[[], Any], consumer: Any = None) -> None:
        self._eventer = eventer
        self._consumer = consumer

    def _dispatcher(self, group: str) -> Any:
        """The consumer's event dispatcher if it sends events of ``group``, else None."""
        dispatcher = self._eventer()
        if dispatcher is None or not dispatcher.enabled:
            return None
        groups = dispatcher.groups
        if groups and group not in groups:
            if group != EVENT_GROUP or "task" not in groups:
                return None
            groups.add(EVENT_GROUP)  # task events were enabled (``enable_events``): ours too
        return dispatcher

    def _send(self, type_: str, **fields: Any) -> None:
        dispatcher = self._dispatcher(type_.split("-", 1)[0])
        if dispatcher is None:
            return
        try:
            dispatcher.send(type_, **fields)
        except Exception as exc:  # an event is never worth a task
            logger.warning("interval: could not send event %s: %s", type_, exc)

    def received(self, held: Held) -> None:
        """The delivery is here: Celery's ``task_received`` signal and ``task-received`` event,
        once, before the task can start (``eta``: its slot when granted already, else its own)."""
        if not held.announced:
            held.announced = True
            self.received_request(held.request, iso_of(held.slot_wall_s))

    def received_request(self, req: Any, slot_iso: str | None = None) -> None:
        """Celery's ``task_received`` signal and ``task-received`` event for ``req``."""
        celery_signals.task_received.send(sender=self._consumer, request=req)
        if not getattr(req.task, "send_events", True) or self._dispatcher("task") is None:
            return
        eta = slot_iso or (req.eta and req.eta.isoformat())
        self._send(
            "task-received",
            uuid=req.id,
            name=req.name,
            args=req.argsrepr,
            kwargs=req.kwargsrepr,
            root_id=req.root_id,
            parent_id=req.parent_id,
            retries=req.request_dict.get("retries", 0),
            eta=eta,
            expires=req.expires and req.expires.isoformat(),
        )

    def granted(self, held: Held, delay_s: float, store: tuple[str, float] | None) -> None:
        """``held`` took ``held.ticket``; ``store`` is (operation, seconds) of the call made."""
        eta = iso_of(held.slot_wall_s)
        signals.slot_granted.send(
            sender=held.request.task,
            request=held.request,
            bucket=held.bucket,
            ticket=held.ticket,
            epoch=held.epoch,
            eta=None if held.slot_wall_s is None else _utc(held.slot_wall_s),
            delay_s=delay_s,
        )
        self._send(
            "interval-granted",
            uuid=held.request.id,
            bucket=held.bucket,
            queue=queue_of(held.bucket),
            ticket=held.ticket,
            epoch=held.epoch,
            eta=eta,
            delay_s=delay_s,
            **_store_fields(store),
        )

    def claimed(
        self, held: Held, outcome: Outcome, late_s: float | None, store: tuple[str, float] | None
    ) -> None:
        """A claim of ``held``'s slot came back with ``outcome``."""
        signals.slot_claimed.send(
            sender=held.request.task,
            request=held.request,
            bucket=held.bucket,
            ticket=held.ticket,
            outcome=outcome.name,
            late_s=late_s,
        )
        self._send(
            "interval-claimed",
            uuid=held.request.id,
            bucket=held.bucket,
            queue=queue_of(held.bucket),
            ticket=held.ticket,
            outcome=outcome.name,
            late_s=late_s,
            **_store_fields(store),
        )

    def control(self, action: str, bucket: str, status: dict[str, Any]) -> None:
        """This worker ran a control ``action`` on ``bucket`` (``status``: the bucket after)."""
        self._send(f"interval-{action}", bucket=bucket, queue=queue_of(bucket), **status)


def _store_fields(store: tuple[str, float] | None) -> dict[str, Any]:
    if store is None:
        return {}
    return {"store_op": store[0], "store_s": store[1]}


def _utc(wall_s: float) -> datetime:
    return datetime.fromtimestamp(wall_s, tz=timezone.utc)
