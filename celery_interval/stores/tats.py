"""The extra limits as the stores write them: the limits argument and the state's ``x`` field."""

from __future__ import annotations

from celery_interval.schedule import Limits, LimitTats

__all__ = ["decode_tats", "encode_tats", "limits_arg"]


def limits_arg(limits: Limits) -> str:
    """The scripts' limits argument: ``<interval_us>:<burst>`` per limit, comma-separated."""
    return ",".join(f"{limit.interval_us}:{max(1, limit.burst)}" for limit in limits)


def encode_tats(tats: tuple[LimitTats, ...]) -> str:
    """``BucketState.limit_tats`` as lib.lua writes field ``x``: ``<grant_us>:<start_us>`` per
    limit, comma-separated, an empty side for None."""
    return ",".join(f"{_side(t.grant_us)}:{_side(t.start_us)}" for t in tats)


def decode_tats(text: str) -> tuple[LimitTats, ...]:
    """Field ``x`` back as ``limit_tats`` ('' is none); ValueError when it is not that."""
    if not text:
        return ()
    tats = []
    for entry in text.split(","):
        grant, sep, start = entry.partition(":")
        if not sep:
            raise ValueError(f"limit times {entry!r} lack ':'")
        tats.append(LimitTats(int(grant) if grant else None, int(start) if start else None))
    return tuple(tats)


def _side(t_us: int | None) -> str:
    return "" if t_us is None else str(t_us)
