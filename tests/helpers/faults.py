"""What the fault tests share: the starts a killed worker or a down store admitted, the tasks
released at a channel close, a Redis broker's redelivery settings, and the FIGURES line."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from celery_interval.schedule.state import MAX_LEAD_US
from tests.helpers.pool import Pool, Worker


def redis_visibility(timeout_s: float) -> dict[str, Any]:
    """A Redis broker redelivers a message unacked this long (kombu checks every second here)."""
    return {
        "broker_transport_options": {
            "visibility_timeout": timeout_s,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    }


#: A start the store admitted before it went down comes at most MAX_LEAD_US later (plus the
#: mapping of its clock to this host's): a later deadline was admitted while it was down. A
#: body may begin later than its deadline on a loaded machine, which is no start admitted.
ADMITTED_BEFORE_NS = (MAX_LEAD_US + 2_000) * 1_000


#: A task admitted to a worker this close to its SIGKILL (store clock) may have begun its body
#: and died before the body recorded its start. Its copy then meets the done mark the pool
#: process posted just before the body (as its last 0.5 ms spin began) and is dropped: Celery
#: runs an early-acked task at most once. The same holds for one whose start came due (the
#: worker acks it then) while its pool process was too slow to begin it: Celery's early ack,
#: which loses such a task too. A task killed before its last spin began (0.5 ms before its start)
#: has no mark, and its copy runs. "Its SIGKILL" is the window ``Pool.kill`` returns: the
#: worker's processes die one by one inside it.
DYING_START_US = 50_000


#: A killed worker and its kill window (store µs, as ``Pool.kill`` returns it).
Kill = tuple[Worker, tuple[int, int]]


def admitted_as_it_died(entry: dict[str, str], kills: list[Kill]) -> bool:
    """``entry`` is a claim:OK by a killed worker with a start inside its kill window (widened
    by ``DYING_START_US``)."""
    return entry["op"] == "claim:OK" and any(
        entry["holder"].startswith(f"{worker.name}/")
        and first_us - DYING_START_US <= int(entry["start"]) <= dead_us + DYING_START_US
        for worker, (first_us, dead_us) in kills
    )


def released_as_the_channel_closed(pool: Pool) -> frozenset[str]:
    """Task ids the workers logged as released to the pool but not accepted at a channel close."""
    found: set[str] = set()
    for worker in pool.workers:
        for match in re.finditer(
            r"released to the pool but not yet accepted \(([^)]*)\)", worker.log()
        ):
            found.update(match.group(1).split(", "))
    return frozenset(found)


def publish(name: str, records: list[dict[str, Any]], ids: list[str], gaps_us: list[int]) -> None:
    """One line of figures for the README's Guarantees table (``pytest -s | grep FIGURES``)."""
    ran = Counter(r["id"] for r in records)
    lost = sum(1 for i in ids if i not in ran)
    doubled = sum(n - 1 for n in ran.values() if n > 1)
    print(
        f"FIGURES {name}: tasks={len(ids)} started={len(records)} lost={lost} doubled={doubled} "
        f"min_gap_ms={min(gaps_us) / 1000:.2f} gaps={len(gaps_us)}"
    )
