"""The request headers the worker sets on a task it releases to the pool, and the ones it reads."""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

__all__ = [
    "BUCKET_HEADER",
    "CLAIMED_HEADER",
    "CLAIM_HEADER",
    "COST_HEADER",
    "INTERNAL_HEADERS",
    "MARK_HEADER",
    "NESTING_HEADER",
    "PARKED_HEADER",
    "RESEND_HEADER",
    "SEND_HEADER",
    "SEND_ONCE",
    "SPIN_HEADER",
    "START_HEADER",
    "TICKET_HEADER",
    "drop_internal_headers",
    "stamp_send",
]

#: A per-call bucket (``apply_async(interval_bucket=...)``).
BUCKET_HEADER = "interval_bucket"
#: A task's cost in its bucket's budget (``interval_cost``), set when it is sent: every copy
#: and redelivery of the message costs the same.
COST_HEADER = "interval_cost"
#: Celery's count of ``task.replace`` calls that led to this message.
NESTING_HEADER = "replaced_task_nesting"
#: Stamped on every task message as it is published: 8 random hex digits telling one send of a
#: task id from another (Celery runs a task id sent twice twice), or ``SEND_ONCE``: copies of
#: the id sent again are dropped as duplicates (the Spark fan-out's re-runs).
SEND_HEADER = "interval_send"
SEND_ONCE = "once"
#: On a throttled task sent again: it keeps its send code (the store kept its place under it),
#: and a worker queues it first for a ticket (its kept slot is the next).
RESEND_HEADER = "interval_resend"
#: On a parked copy in an overflow queue: the queue the task was sent to and its delivery's
#: ``exchange``, ``routing_key`` and ``redelivered``, restored when it is taken back.
PARKED_HEADER = "interval_parked"
#: The start deadline on the worker host's monotonic clock (ns).
START_HEADER = "interval_start_ns"
#: The same start on the store's clock (µs): the ledger's ``start`` of the claim that admitted it.
STORE_START_HEADER = "interval_start_us"
#: The worker's estimate of the store clock minus this host's monotonic one (ns), with which a
#: pool process that claims again maps its new start (``worker.clock.local_ns``).
CLOCK_HEADER = "interval_clock_offset_ns"
#: How long the pool process spins before the deadline (ns).
SPIN_HEADER = "interval_spin_ns"
#: When the worker's claim came back (monotonic ns).
CLAIMED_HEADER = "interval_claimed_ns"
#: The ticket the start was claimed with.
TICKET_HEADER = "interval_ticket"
#: What a pool process needs to claim again when it reached the task after its start:
#: ``stores.base.ClaimArgs`` (bucket, task_id, retries, interval_us, epoch, slot_us, holder,
#: ticket, handoff_us, burst, cost, limits, cap).
CLAIM_HEADER = "interval_claim"
#: Set on an ordinary (early-ack) task whose pool process posts its done mark before its body.
MARK_HEADER = "interval_mark"
#: Set by the worker on the request it releases; a message's own copies are stale or forged
#: (Celery copies custom headers into a retry's message).
INTERNAL_HEADERS = (
    START_HEADER,
    STORE_START_HEADER,
    CLOCK_HEADER,
    SPIN_HEADER,
    CLAIMED_HEADER,
    TICKET_HEADER,
    CLAIM_HEADER,
    MARK_HEADER,
    PARKED_HEADER,
    RESEND_HEADER,
)


def stamp_send(headers: Any = None, **_: Any) -> None:
    """``before_task_publish``: give this send of the task its own code, unless it is to be
    run once per task id (a copied code, from a retry's or a replacement's headers, is renewed)
    or it is a throttled task sent again (``RESEND_HEADER``: it keeps its code).
    """
    if not isinstance(headers, dict):
        return
    if headers.get(RESEND_HEADER):  # its code as it was (none, if it was sent without)
        return
    if headers.get(SEND_HEADER) != SEND_ONCE:
        headers[SEND_HEADER] = os.urandom(4).hex()


def drop_internal_headers(headers: MutableMapping[str, Any]) -> None:
    """Forget the worker's own headers a message arrived with (stale, or forged)."""
    for name in INTERNAL_HEADERS:
        headers.pop(name, None)
