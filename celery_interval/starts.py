"""What a ledger entry says about starts: which entries are starts, and which break the interval
or a burst's budget (one rule for the Spark audit, the demo's figures and the exporter)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "AGAIN",
    "BURST",
    "CONTROL_OPS",
    "COST",
    "GRANT_OP",
    "LIMITS",
    "MISSED",
    "MOVED",
    "READMIT",
    "START_OP",
    "THROTTLE_OP",
    "Budget",
    "happened",
    "is_grant",
    "is_moved",
    "is_readmit",
    "is_start",
    "is_violation",
    "limits_of",
    "replaces",
    "start_time_us",
    "units_of",
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
#: Set (1) on a readmit whose start replaces the one its holder missed: no start was admitted
#: after that one (it is the bucket's start just before, of the same task, retry and holder),
#: so it moved to the new time and never happened where it first was.
MOVED = "moved"
#: Set (1) on a claim of the holder's own lease answered other than OK (the queue paused, a
#: wait, every place taken): its admitted start has not happened, and happens only if a later
#: OK of the same holder comes (``again``, a readmit, or a new start once the lease lapsed);
#: without one, a start of the task by another holder (its message redelivered) is its one
#: run, not a duplicate. A *missed* start is one its holder did not use, here as in a readmit.
MISSED = "missed"
#: The op of a throttled run (``Throttled``): the task's next start is its run again, not a
#: duplicate of it.
THROTTLE_OP = "throttle"
#: On a claim of a bucket with a burst or of a task with a cost: the bucket's burst and the
#: task's cost, in units of one interval's budget (absent: 1).
BURST = "burst"
COST = "cost"
#: On a claim of a bucket with extra limits: each one's interval (µs) and burst, as
#: ``<interval_us>:<burst>`` comma-separated (absent: none).
LIMITS = "limits"
#: The control entries that record the interval in force (``interval``) without a start.
CONTROL_OPS = ("pause", "unpause", "set_interval", "unset_interval")


_Entry = TypeVar("_Entry", bound=Mapping[str, Any])


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


def is_moved(fields: Mapping[str, object]) -> bool:
    """Whether a start replaces the bucket's start just before it, which its holder missed."""
    return is_readmit(fields) and _flag(fields, MOVED)


def replaces(fields: Mapping[str, object], before: Mapping[str, object] | None) -> bool:
    """Whether a start moved the start ``before`` it (the bucket's previous start, in the
    ledger's order): a moved readmit of the same task, retry and holder."""
    return (
        before is not None
        and is_moved(fields)
        and all(str(fields.get(k)) == str(before.get(k)) for k in ("task", "r", "holder"))
    )


def happened(entries: Iterable[_Entry]) -> list[_Entry]:
    """The starts among one bucket's ``entries`` (in the ledger's order) that happened: every
    start, less each one its holder missed that a moved readmit replaced."""
    starts: list[_Entry] = []
    for fields in entries:
        if not is_start(fields):
            continue
        if starts and replaces(fields, starts[-1]):
            starts.pop()
        starts.append(fields)
    return starts


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


def units_of(fields: Mapping[str, object]) -> tuple[int, int]:
    """A start's ``(burst, cost)``: its entry's ``burst`` and ``cost``, 1 where absent."""

    def unit(name: str) -> int:
        value = fields.get(name)
        try:
            return max(1, int(str(value))) if value is not None else 1
        except ValueError:
            return 1

    return unit(BURST), unit(COST)


def limits_of(fields: Mapping[str, object]) -> tuple[tuple[int, int], ...]:
    """A start's extra limits, ``(interval_us, burst)`` each, from its entry (() where absent
    or unreadable)."""
    value = fields.get(LIMITS)
    if value is None:
        return ()
    limits = []
    for entry in str(value).split(","):
        interval, _, burst = entry.partition(":")
        try:
            limits.append((max(1, int(interval)), max(1, int(burst))))
        except ValueError:
            return ()
    return tuple(limits)


@dataclass
class Budget:
    """The rule for a bucket's starts fed in ledger order (the store's order of its claims):
    for every window of starts Σ cost <= burst + span / interval, checked as the store does
    (a GCRA: ``celery_interval.schedule.burst``), and the same for each extra limit the start
    was counted against (``limits_of``). With burst = cost = 1 and no extra limits it is
    ``is_violation`` of each start against the one before; a violation's excess is not carried
    on, so each breach counts once."""

    #: The starts' theoretical arrival time (µs, the store's real clock); None: no start yet.
    tat_us: int | None = None
    #: Each extra limit's, by its (interval_us, burst).
    limit_tats_us: dict[tuple[int, int], int] = field(default_factory=dict)
    #: The extra limits the last start fed broke, (interval_us, burst) each.
    broken_limits: tuple[tuple[int, int], ...] = ()

    def overdraws(
        self,
        start_us: int,
        interval_us: int,
        burst: int = 1,
        cost: int = 1,
        limits: tuple[tuple[int, int], ...] = (),
    ) -> bool:
        """Feed a start; whether it broke the budget (the interval, with no burst) or any
        extra limit's."""
        cost = max(1, cost)
        broke, self.tat_us = _gcra(self.tat_us, start_us, interval_us, burst, cost)
        broken = []
        for limit in limits:
            over, self.limit_tats_us[limit] = _gcra(
                self.limit_tats_us.get(limit), start_us, limit[0], limit[1], cost
            )
            if over:
                broken.append(limit)
        self.broken_limits = tuple(broken)
        return broke or bool(broken)

    def moved(
        self,
        start_us: int,
        interval_us: int,
        cost: int = 1,
        limits: tuple[tuple[int, int], ...] = (),
    ) -> None:
        """The last start fed moved to the later ``start_us`` (``is_moved``): each budget's
        theoretical arrival time as if that start had been there (it breaks nothing: every
        earlier start is further from it)."""
        cost = max(1, cost)
        if self.tat_us is not None:
            self.tat_us = max(self.tat_us, start_us + cost * interval_us)
        for limit in limits:
            tat_us = self.limit_tats_us.get(limit)
            if tat_us is not None:
                self.limit_tats_us[limit] = max(tat_us, start_us + cost * limit[0])
        self.broken_limits = ()


def _gcra(
    tat_us: int | None, start_us: int, interval_us: int, burst: int, cost: int
) -> tuple[bool, int]:
    """Whether a start of ``cost`` at ``start_us`` broke a budget of ``burst`` units refilled
    one per ``interval_us``, and the budget's next theoretical arrival time (a breach's excess
    not carried on)."""
    burst = max(1, burst)
    tat_us = start_us if tat_us is None else tat_us
    broke = tat_us - start_us > max(0, burst - cost) * interval_us
    return broke, min(max(tat_us, start_us) + cost * interval_us, start_us + burst * interval_us)
