"""Ledger entries made by hand, as the store's scripts write them, for the monitor's tallies."""

from __future__ import annotations

I_US = 100_000
T0 = 1_800_000_000_000_000


def claim_ok(
    task: str, start: int, late: int = 0, interval: int | None = I_US, **flags: int
) -> dict[str, str]:
    fields: dict[str, object] = {"op": "claim:OK", "now": start - 5, "task": task, "r": 0,
                                 "slot": start - late, "holder": "w1/0123456789ab",
                                 "start": start, "late": late, **flags}  # fmt: skip
    if interval is not None:
        fields["interval"] = interval
    return {k: str(v) for k, v in fields.items()}


def grant_ok(task: str, **flags: int) -> dict[str, str]:
    return {k: str(v) for k, v in {"op": "grant:OK", "now": T0, "task": task, **flags}.items()}
