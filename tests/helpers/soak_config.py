"""The soak's buckets and their limits: one table the soak app, the runner and the checker share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The main queue: pause/unpause, set_interval, revoke, retry, replace.
MAIN_S = 0.03
#: set_interval lengthens the main queue's interval to this, then unset_interval restores it.
MAIN_SLOW_S = 0.06
#: The tenants' queue bucket is their outer bucket: all tenants together keep it, and share
#: its starts fairly (the flooding tenant with weight 2).
OUTER_S = 0.025
TENANT_S = 0.075
#: Burst of the tenants and of their outer bucket; tasks cost 1 or 2 units.
BURST = 3
#: The limited bucket: its interval and two extra limits (rate, burst) on one record.
LIMITED_S = 0.05
LIMITS: tuple[tuple[str, int], ...] = (("8/s", 1), ("300/min", 3))
LIMITS_US: tuple[tuple[int, int], ...] = ((125_000, 1), (200_000, 3))
#: The capped bucket: at most CAP bodies of CAP_BODY_S at once.
CAPPED_S = 0.02
CAP = 2
CAP_BODY_S = 0.25
#: The throttled bucket calls a limiting HTTP server allowing API_RATE calls a second.
THROTTLED_S = 0.1
API_RATE = 5.0
#: A claimed task's lease (a killed worker's claims come back after it).
LEASE_S = 3.0
#: A worker holds this much of a bucket's pace; the rest of a flood parks.
HOLD_AHEAD_S = 0.5


@dataclass(frozen=True)
class Rule:
    """What the checker holds one bucket's starts to (intervals in µs)."""

    interval_us: int
    burst: int = 1
    limits: tuple[tuple[int, int], ...] = ()
    cap: int = 0
    #: The bucket whose budget every start of this one also spends ("" for none).
    outer: str = ""


@dataclass(frozen=True)
class Layout:
    """The soak's queue names, all under one prefix (one run, one set of queues)."""

    prefix: str
    main: str = field(init=False)
    tenants: str = field(init=False)
    limited: str = field(init=False)
    capped: str = field(init=False)
    throttled: str = field(init=False)

    def __post_init__(self) -> None:
        for name, suffix in (
            ("main", "m"),
            ("tenants", "t"),
            ("limited", "l"),
            ("capped", "c"),
            ("throttled", "h"),
        ):
            object.__setattr__(self, name, f"{self.prefix}{suffix}")

    @property
    def queues(self) -> tuple[str, ...]:
        return (self.main, self.tenants, self.limited, self.capped, self.throttled)

    def conf(self) -> dict[str, Any]:
        """The app settings every soak worker runs with."""
        return {
            "interval_queues": {
                self.main: MAIN_S,
                self.tenants: {"interval": OUTER_S, "burst": BURST, "fair": True},
                f"{self.tenants}:*": {"outer": self.tenants},
                f"{self.tenants}:flood": {"weight": 2},
                self.limited: {"interval": LIMITED_S, "limits": [list(x) for x in LIMITS]},
                self.capped: {"interval": CAPPED_S, "concurrency": CAP},
                self.throttled: THROTTLED_S,
            },
            "interval_lease_s": LEASE_S,
            "interval_hold_ahead_s": HOLD_AHEAD_S,
            "interval_store_timeout_s": 0.5,
            "interval_retry_max_s": 1.0,
        }

    def rule(self, bucket: str) -> Rule:
        """The limits of ``bucket`` as configured (set_interval overrides apart)."""
        if bucket == self.main:
            return Rule(round(MAIN_S * 1e6))
        if bucket == self.tenants:
            return Rule(round(OUTER_S * 1e6), burst=BURST)
        if bucket.startswith(f"{self.tenants}:"):
            return Rule(round(TENANT_S * 1e6), burst=BURST, outer=self.tenants)
        if bucket == self.limited:
            return Rule(round(LIMITED_S * 1e6), limits=LIMITS_US)
        if bucket == self.capped:
            return Rule(round(CAPPED_S * 1e6), cap=CAP)
        if bucket == self.throttled:
            return Rule(round(THROTTLED_S * 1e6))
        raise KeyError(f"not a soak bucket: {bucket!r}")
