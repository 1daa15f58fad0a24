"""Decoding the Lua scripts' replies (grant, claim, status) and stored marks into schedule types."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from celery_interval.errors import StoreError
from celery_interval.schedule import (
    Claim,
    Done,
    Grant,
    Granted,
    Lease,
    Mark,
    Outcome,
    Pace,
    Status,
    Unset,
)
from celery_interval.schedule.fair import FairShare, Tag
from celery_interval.stores.tats import limits_arg

__all__ = [
    "as_text",
    "claim_of",
    "decode_fair",
    "decode_mark",
    "flag_of",
    "grant_of",
    "outcome_of",
    "status_from_reply",
    "status_pace_args",
    "unset_of",
]


def as_text(value: Any) -> str:
    """A reply value as str: bytes are UTF-8."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


#: Each outcome by its name as a reply holds it (bytes) or as text.
_OUTCOMES: dict[Any, Outcome] = {
    **{o.value: o for o in Outcome},
    **{o.value.encode(): o for o in Outcome},
}


def outcome_of(value: Any) -> Outcome:
    """A reply's outcome name as an Outcome (ValueError if it is none)."""
    found = _OUTCOMES.get(value)
    return Outcome(as_text(value)) if found is None else found


def grant_of(r: Any) -> Grant:
    """Decode grant_op's reply."""
    return Grant(
        outcome=outcome_of(r[0]),
        epoch=int(r[1]),
        ticket=int(r[2]),
        slot_us=int(r[3]),
        delay_us=int(r[4]),
        paused=bool(int(r[5])),
    )


def flag_of(r: Any) -> bool:
    """Decode a 0|1 reply (renew, release, renew_place: whether it held)."""
    return bool(int(r))


def claim_of(r: Any) -> Claim:
    """Decode claim_op's reply."""
    born = r[4] if len(r) > 4 else None
    born_us = None if born in (None, "", b"") else int(born)
    return Claim(outcome_of(r[0]), int(r[1]), int(r[2]), int(r[3]), born_us)


def status_from_reply(reply: Sequence[Any]) -> Status:
    """Decode lib.lua's ``status_reply`` array (read with the bucket's pace, by status.lua or
    a control script, it ends with the units left of each budget)."""
    (
        exists,
        epoch,
        interval_us,
        overridden,
        paused,
        ticket,
        next_in,
        cur,
        last,
        v,
        adapted,
        running,
        *units,
    ) = (int(x) for x in reply)
    return Status(
        units_left=tuple(units),
        running=running,
        adapted=bool(adapted),
        exists=bool(exists),
        epoch=epoch,
        interval_us=interval_us,
        overridden=bool(overridden),
        paused=bool(paused),
        ticket=ticket,
        next_slot_in_us=next_in,
        current_slot_us=cur,
        last_start_us=last,
        virtual_now_us=v,
    )


def status_pace_args(pace: Pace | None) -> list[int | str]:
    """The ARGV a status is read with (status.lua's after the interval, the control scripts'
    last): the bucket's burst and extra limits (none: the status without them)."""
    return [] if pace is None else [pace.burst, limits_arg(pace.limits)]


def unset_of(reply: Sequence[Any]) -> Unset:
    """Decode unset_interval.lua's reply: the status array, then dropped (0|1)."""
    return Unset(status_from_reply(reply[:-1]), flag_of(reply[-1]))


def decode_mark(raw: str | bytes | None) -> Mark | None:
    """Parse a mark value (``L|holder|start_us|expires_real_us|epoch|tat_us|admitted``, the
    last three absent in a lease of an older version, a nested bucket's followed by
    ``|O<outer_tat_us>``; ``D|expires_real_us`` or
    ``G|epoch|ticket|slot_us|expires_real_us``, or ``F|…`` as ``G|…`` for a front grant)."""
    if raw is None:
        return None
    value = as_text(raw)
    if value.startswith("D|"):
        return Done(int(value[2:]))
    if value.startswith(("G|", "F|")):
        epoch, ticket, slot_us, until_us = (int(x) for x in value[2:].split("|"))
        return Granted(epoch, ticket, slot_us, until_us, value[0] == "F")
    if value.startswith("L|"):
        outer_tat_us = None
        head, _, last = value.rpartition("|")
        if last.startswith("O"):
            value, outer_tat_us = head, int(last[1:])
        parts = value[2:].rsplit("|", 5)
        if len(parts) == 6:
            holder, *numbers = parts
            start_us, expires_us, lease_epoch, tat_us, admitted = (int(x) for x in numbers)
            return Lease(holder, start_us, expires_us, lease_epoch, tat_us, admitted, outer_tat_us)
        holder, *times = value[2:].rsplit("|", 2)
        return Lease(holder, int(times[0]), int(times[1]))
    raise StoreError(f"malformed interval mark {value!r}")


def decode_fair(fields: dict[str, str]) -> FairShare:
    """An outer bucket's fair share from its hash (fair.lua): ``v`` and ``k:<key>`` fields of
    ``finish|want_until|weight|due``."""
    tags = []
    for name, value in fields.items():
        if name.startswith("k:"):
            finish_us, want_until_us, weight, due_us = (int(x) for x in value.split("|"))
            tags.append(Tag(name[2:], finish_us, want_until_us, weight, due_us))
    return FairShare(int(fields.get("v", 0)), tuple(sorted(tags)))
