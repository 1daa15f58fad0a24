"""The request headers the worker sets on a task it releases to the pool, and the ones it reads."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

__all__ = [
    "BUCKET_HEADER",
    "CLAIMED_HEADER",
    "CLAIM_HEADER",
    "INTERNAL_HEADERS",
    "MARK_HEADER",
    "NESTING_HEADER",
    "SPIN_HEADER",
    "START_HEADER",
    "TICKET_HEADER",
    "drop_internal_headers",
]

#: A per-call bucket (``apply_async(interval_bucket=...)``).
BUCKET_HEADER = "interval_bucket"
#: Celery's count of ``task.replace`` calls that led to this message.
NESTING_HEADER = "replaced_task_nesting"
#: The start deadline on the worker host's monotonic clock (ns).
START_HEADER = "interval_start_ns"
#: How long the pool process spins before the deadline (ns).
SPIN_HEADER = "interval_spin_ns"
#: When the worker's claim came back (monotonic ns).
CLAIMED_HEADER = "interval_claimed_ns"
#: The ticket the start was claimed with.
TICKET_HEADER = "interval_ticket"
#: What a pool process needs to claim again when it reached the task after its start:
#: ``[bucket, task_id, retries, interval_us, epoch, slot_us, holder, ticket, handoff_us]``.
CLAIM_HEADER = "interval_claim"
#: Set on an ordinary (early-ack) task whose pool process posts its done mark before its body.
MARK_HEADER = "interval_mark"
#: Set by the worker on the request it releases; a message's own copies are stale or forged
#: (Celery copies custom headers into a retry's message).
INTERNAL_HEADERS = (
    START_HEADER,
    SPIN_HEADER,
    CLAIMED_HEADER,
    TICKET_HEADER,
    CLAIM_HEADER,
    MARK_HEADER,
)


def drop_internal_headers(headers: MutableMapping[str, Any]) -> None:
    """Forget the worker's own headers a message arrived with (stale, or forged)."""
    for name in INTERNAL_HEADERS:
        headers.pop(name, None)
