"""What the soak reads from the store's ledgers: the throttles, and the tasks that died as
their bodies began (a copy dropped as a duplicate after its worker's SIGKILL)."""

from __future__ import annotations

from typing import Any

import redis

from celery_interval.config.table import KEY_PREFIX
from celery_interval.placement import SEND_SHIFT
from celery_interval.stores.keys import ledger_key

#: A task admitted to a worker this close to its SIGKILL may have died as its body began
#: (``test_faults.DYING_START_US``).
DYING_START_US = 50_000

#: (bucket, stream entry id) → the entry's fields.
Ledger = dict[tuple[str, bytes], dict[str, str]]


def read_ledgers(url: str, buckets: list[tuple[str, str | None]], into: Ledger) -> None:
    """Add every entry of each (bucket, its outer bucket or None) ledger (read before a state
    loss, and at the end); a nested bucket's ledger key carries its outer's hash tag."""
    conn = redis.Redis.from_url(url, socket_timeout=5)
    try:
        for bucket, outer in buckets:
            entries: Any = conn.xrange(ledger_key(KEY_PREFIX, bucket, outer))
            for entry_id, fields in entries:
                into[(bucket, entry_id)] = {k.decode(): v.decode() for k, v in fields.items()}
    finally:
        conn.close()


def throttles(ledger: Ledger, wall_offset_ns: int) -> list[tuple[str, int, int]]:
    """(bucket, monotonic ns, retry_after ns) of each throttle the store recorded."""
    return [
        (bucket, int(e["now"]) * 1000 - wall_offset_ns, int(e["retry_after"]) * 1000)
        for (bucket, _), e in sorted(ledger.items())
        if e.get("op") == "throttle"
    ]


def died_as_they_began(ledger: Ledger, kill_windows_us: list[tuple[str, int, int]]) -> set[str]:
    """Tasks admitted to a worker within ``DYING_START_US`` of its kill window (wall µs)
    whose copy was then dropped as a duplicate: Celery's early ack runs them at most once."""
    dropped = {
        e["task"] for e in ledger.values() if e.get("op") in ("grant:DUPLICATE", "claim:DUPLICATE")
    }
    found = set()
    for e in ledger.values():
        if e.get("op") != "claim:OK" or e["task"] not in dropped or "again" in e:
            continue
        start_us = int(e.get("start", 0))
        for name, first_us, dead_us in kill_windows_us:
            if e.get("holder", "").startswith(f"{name}/") and (
                first_us - DYING_START_US <= start_us <= dead_us + DYING_START_US
            ):
                found.add(e["task"])
    return found


def retries_in(entry: dict[str, str]) -> int:
    """A ledger entry's retries: its ``r`` holds the send's code above them
    (``placement.SEND_SHIFT``), the bodies' records only the retries."""
    return int(entry["r"]) & ((1 << SEND_SHIFT) - 1)


def in_ledger(ledger: Ledger) -> set[tuple[str, int]]:
    """(task id, retries) of each message the ledger names."""
    return {(e["task"], retries_in(e)) for e in ledger.values() if "task" in e and "r" in e}


def resent_unseen(ledger: Ledger) -> set[tuple[str, int]]:
    """(task id, retries) whose last entry, in stream order, is a throttle: no worker took a
    ticket for the copy its worker sent again."""
    last: dict[tuple[str, int], str] = {}
    for _key, e in sorted(ledger.items(), key=lambda kv: _order(kv[0][1])):
        if "task" in e and "r" in e:
            last[(e["task"], retries_in(e))] = e.get("op", "")
    return {key for key, op in last.items() if op == "throttle"}


def _order(entry_id: bytes) -> tuple[int, int]:
    ms, _, seq = entry_id.partition(b"-")
    return int(ms), int(seq or 0)
