"""RedisStore's Lua scripts: the text sent for each (lib.lua and the parts it needs, then the
script) and the encoding of their calls' arguments and replies."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from importlib.resources import files
from typing import Any, TypeAlias

from celery_interval.schedule import Claim, ClaimTerms, Grant, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.codec import claim_of, grant_of
from celery_interval.stores.redis_nested import NESTED_SCRIPTS

__all__ = [
    "LIBRARY_PARTS",
    "SCRIPT_NAMES",
    "TAKES_PER_CALL",
    "Named",
    "batched",
    "cap_args",
    "claimer_arg",
    "lua_text",
    "not_after_arg",
    "script_source",
    "share_arg",
    "taken_of",
]

#: A script call by the script's name: name, keys, arguments (the clock override first).
Named: TypeAlias = "tuple[str, Sequence[str], Sequence[Any]]"

SCRIPT_NAMES = (
    "grant",
    "claim",
    "take",
    "take_many",
    "done",
    "renew",
    "pause",
    "unpause",
    "set_interval",
    "unset_interval",
    "status",
    "reset",
    "throttle",
    "release",
    "renew_place",
    *NESTED_SCRIPTS,
)

#: The scripts that run ops.lua's grant_op and claim_op.
_RUN_OPS = frozenset({"grant", "claim", "take", "take_many"})

#: Takes per take_many.lua call: a call's set-up (by EVALSHA, lib.lua's functions made anew) is
#: paid once per call, and Redis serves other clients between calls.
TAKES_PER_CALL = 20


#: The Lua the scripts share, in the order each script's text includes what it needs of it.
LIBRARY_PARTS = ("lib", "limits", "front", "ops", "fair", "outer")


def lua_text(name: str) -> str:
    """The text of ``stores/lua/<name>.lua``."""
    return (files("celery_interval.stores") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


@functools.cache
def script_source(name: str, fenced: bool = False) -> str:
    """The full text sent to Redis for script ``name``: lib.lua followed by ``<name>.lua``.

    ``fenced`` (a replicated store: Sentinel, Cluster): each state carries the replication id
    of the master that saved it, and a master that finds another's fences it
    (``schedule.fenced``); otherwise the scripts never look (lib.lua's FENCED)."""
    if name not in SCRIPT_NAMES:
        raise ValueError(f"unknown script {name!r}")
    parts: tuple[str, ...] = ("lib", "limits", name)
    if name in _RUN_OPS or name in NESTED_SCRIPTS:
        nested = ("fair", "outer") if name in NESTED_SCRIPTS else ()
        parts = ("lib", "limits", "front", "ops", *nested, name)
    flag = f"local FENCED = {'true' if fenced else 'false'}"
    return "\n".join([flag, *(lua_text(part) for part in parts)])


def taken_of(reply: Any) -> tuple[Grant, Claim | None]:
    """Decode take.lua's reply: the grant, then the claim when it claimed."""
    return grant_of(reply), (claim_of(reply[6:]) if len(reply) > 6 else None)


def batched(calls: Sequence[Named]) -> list[tuple[Named, bool]]:
    """The take calls in order, runs of take.lua's grouped TAKES_PER_CALL to a take_many.lua
    call (True); a nested bucket's take goes on its own (False)."""
    batches: list[tuple[Named, bool]] = []
    run: list[Named] = []
    for call in [*calls, None]:
        if call is not None and call[0] == "take" and len(run) < TAKES_PER_CALL:
            run.append(call)
            continue
        if run:
            batches.append((_grouped(run), True))
            run = []
        if call is not None and call[0] == "take":
            run.append(call)
        elif call is not None:
            batches.append((call, False))
    return batches


def _grouped(calls: Sequence[Named]) -> Named:
    """One take_many.lua call running the take.lua ``calls`` (each with the same number of
    keys and arguments) one after another."""
    _name, first_keys, first_args = calls[0]
    flat_keys = [key for _n, call_keys, _a in calls for key in call_keys]
    flat_args = [arg for _n, _k, call_args in calls for arg in call_args]
    return ("take_many", flat_keys, [len(first_keys), len(first_args), *flat_args])


def not_after_arg(pace: Pace) -> str | int:
    """grant_op's not_after_in_us argument ('' = none)."""
    return "" if pace.not_after_in_us is None else pace.not_after_in_us


def share_arg(pace: Pace) -> str:
    """An interactive start's share (front.lua), or '' for none; ``repr`` round-trips the
    double exactly, so the Lua divides by the same number as the model."""
    return "" if pace.share is None else repr(pace.share)


def claimer_arg(terms: ClaimTerms) -> str:
    """A claiming script's last argument: the birth of the store its claimer saw ('' = none),
    after an ``r`` when the claimed message was delivered before (lib.lua's claimer_args)."""
    knew = "" if terms.knew_born_us is None else str(terms.knew_born_us)
    return ("r" if terms.redelivered else "") + knew


def cap_args(copy: TaskCopy, terms: ClaimTerms) -> list[str | int]:
    """claim_op's cap arguments: the cap ('' = none), place_us and the body's place name."""
    place_us = terms.lease_us if terms.place_us is None else terms.place_us
    return ["" if terms.cap is None else terms.cap, place_us, copy.place]
