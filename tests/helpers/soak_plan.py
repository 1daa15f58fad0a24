"""What the soak sends each tick (from its seed): every bucket's tasks, and each job's steps."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.soak_config import Layout

#: The tenants' keys: a few ordinary ones, and one that floods (its backlog parks).
TENANT_KEYS = (*(f"k{i}" for i in range(6)), "flood")


@dataclass(frozen=True)
class Send:
    """One task to send: its job, its task name, arguments and queue, and the steps it runs
    ((task name, retries) each)."""

    job: str
    task: str
    args: tuple[Any, ...]
    queue: str
    steps: list[tuple[str, int]]
    kwargs: dict[str, Any] = field(default_factory=dict)


def batch(tick: int, rng: random.Random, layout: Layout) -> tuple[list[Send], dict[str, Any]]:
    """The tick's sends, and the steps of jobs that follow from them (a replacement's)."""
    sends: list[Send] = []
    follow: dict[str, list[tuple[str, int]]] = {}
    for n in range(rng.choice((1, 1, 2))):
        job = f"m{tick}.{n}"
        roll = rng.random()
        if roll < 0.1:
            fails = rng.randint(1, 2)
            steps = [("soak.step", r) for r in range(fails + 1)]
            sends.append(Send(job, "soak.step", (job,), layout.main, steps, {"fail_times": fails}))
        elif roll < 0.16:
            sends.append(Send(job, "soak.replacer", (job,), layout.main, [("soak.replacer", 0)]))
            follow[f"{job}/r"] = [("soak.step", 0)]
        else:
            sends.append(Send(job, "soak.step", (job,), layout.main, [("soak.step", 0)]))
    key = rng.choice(TENANT_KEYS[:-1])
    units = rng.choice((1, 2))
    tenant = [("soak.tenant", 0)]
    sends.append(
        Send(f"t{tick}", "soak.tenant", (f"t{tick}", key), layout.tenants, tenant, {"units": units})
    )
    if tick % 20 == 5:
        for i in range(12):
            job = f"f{tick}.{i}"
            sends.append(Send(job, "soak.tenant", (job, "flood"), layout.tenants, tenant))
    if tick % 2 == 1:  # 2 a second: the limits allow 5, less while the store is out
        sends.append(
            Send(f"l{tick}", "soak.limited", (f"l{tick}",), layout.limited, [("soak.limited", 0)])
        )
    if tick % 2 == 0:
        sends.append(
            Send(f"c{tick}", "soak.capped", (f"c{tick}",), layout.capped, [("soak.capped", 0)])
        )
    if tick % 16 == 0:  # each 429 defers the bucket a whole second (Retry-After: 1)
        for i in range(4):
            job = f"h{tick}.{i}"
            sends.append(
                Send(job, "soak.call_api", (job,), layout.throttled, [("soak.call_api", 0)])
            )
    return sends, follow
