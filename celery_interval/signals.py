"""Signals for users who hook into slots and control actions, in the style of Celery's own."""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "bucket_reset",
    "interval_changed",
    "queue_paused",
    "queue_unpaused",
    "slot_claimed",
    "slot_granted",
]

#: A worker took a ticket for a held task (its own grant, or a revoked task's ticket handed
#: over). Sent in the worker, ``sender`` = the task; ``eta`` = the slot (aware UTC datetime).
slot_granted = Signal(
    name="interval_slot_granted",
    providing_args={"request", "bucket", "ticket", "epoch", "eta", "delay_s"},
)

#: A worker's claim of a held task's slot came back. ``outcome`` is ``OK`` (the task starts
#: ``late_s`` after its slot), ``WAIT``, ``PAUSED``, ``HELD``, ``RETICKET`` or ``DUPLICATE``.
slot_claimed = Signal(
    name="interval_slot_claimed",
    providing_args={"request", "bucket", "ticket", "outcome", "late_s"},
)

#: A bucket was paused, in the process that paused it (a caller of ``control.pause``, and each
#: worker that received the ``pause_queue`` broadcast); ``sender`` = the bucket's name.
queue_paused = Signal(name="interval_queue_paused", providing_args={"bucket", "status"})

#: A bucket was unpaused; sent as ``queue_paused`` is.
queue_unpaused = Signal(name="interval_queue_unpaused", providing_args={"bucket", "status"})

#: A bucket's interval was overridden (``set``) or its override dropped (``unset``); sent as
#: ``queue_paused`` is. ``interval_s`` is the interval in force after it.
interval_changed = Signal(
    name="interval_changed", providing_args={"bucket", "status", "interval_s", "action"}
)

#: A bucket's state was forgotten (``reset``): a new epoch begins.
bucket_reset = Signal(name="interval_bucket_reset", providing_args={"bucket"})
