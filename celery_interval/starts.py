"""What a ledger entry says about starts: which entries are starts, and which gaps break the
interval (one rule for the Spark audit, the demo's figures and the exporter)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "AGAIN",
    "CONTROL_OPS",
    "GRANT_OP",
    "READMIT",
    "START_OP",
    "THROTTLE_OP",
    "is_grant",
    "is_readmit",
    "is_start",
    "is_violation",
    "start_time_us",
]

#: The op of an admitted start (a claim answered OK).
START_OP = "claim:OK"
#: The op of a ticket handed out.
GRANT_OP = "grant:OK"
#: Set (1) on a holder's re-claim of its own lease before its start, and on a copy's grant
#: of the ticket it already had: a repeat, not a new start or ticket.
AGAIN = "again"
#: Set (1) on a start admitted anew because the holder's earlier admitted start passed unheard.
READMIT = "readmit"
#: The op of a throttled run (``Throttled``): the task's next start is its run again, not a
#: duplicate of it.
THROTTLE_OP = "throttle"
#: The control entries that record the interval in force (``interval``) without a start.
CONTROL_OPS = ("pause", "unpause", "set_interval", "unset_interval")


def _flag(fields: Mapping[str, object], name: str) -> bool:
    value = fields.get(name)
    return value is not None and str(value) == "1"


def is_start(fields: Mapping[str, object]) -> bool:
    """Whether an entry is a start: a ``claim:OK`` that is not a re-claim (``again=1``)."""
    return fields.get("op") == START_OP and not _flag(fields, AGAIN)


def is_grant(fields: Mapping[str, object]) -> bool:
    """Whether an entry hands out a new ticket (``grant:OK``, not a copy's ``again=1``)."""
    return fields.get("op") == GRANT_OP and not _flag(fields, AGAIN)


def is_readmit(fields: Mapping[str, object]) -> bool:
    """Whether a start replaces an earlier admitted start of the same task that passed unheard."""
    return is_start(fields) and _flag(fields, READMIT)


def start_time_us(fields: Mapping[str, object]) -> int:
    """The store real time (µs) a start admitted: its ``start``, else its ``now``."""
    value = fields.get("start")
    if value is None:
        value = fields.get("now", 0)
    return int(str(value))


def is_violation(gap_us: int, interval_us: int) -> bool:
    """Whether the gap between two consecutive admitted starts is shorter than the interval in
    force at the later one: the interval broken."""
    return gap_us < interval_us
