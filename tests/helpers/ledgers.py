"""Readers of a bucket's ledger for tests: its entries, admitted starts, claims and throttles."""

from __future__ import annotations

from typing import Any

import redis

from celery_interval.config.table import KEY_PREFIX
from celery_interval.starts import happened, is_moved, is_readmit
from celery_interval.stores.keys import ledger_key
from tests.helpers.pool import Pool


def ledger_entries(client: redis.Redis[Any], bucket: str) -> list[dict[str, str]]:
    """``bucket``'s ledger entries on ``client``'s server, oldest first, as str → str."""
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _id, fields in client.xrange(ledger_key(KEY_PREFIX, bucket))
    ]


def ledger(pool: Pool, bucket: str | None = None) -> list[dict[str, str]]:
    """The ledger entries of ``bucket`` (default: the pool's queue) on the pool's recorder,
    oldest first, as str → str."""
    return ledger_entries(pool.recorder, bucket or pool.queue)


def claim_times_us(
    pool: Pool, task_id: str | None = None, *, readmits: bool = True, bucket: str | None = None
) -> list[int]:
    """Store-clock start times of every OK claim (of one task) that happened, read from the
    ledger of ``bucket`` (default: the pool's queue): a start its holder missed that a moved
    readmit replaced is left out.

    ``readmits=False`` leaves out a holder's new start after its admitted one passed unused (a
    pool process that came too late) where the missed start still counts: one start per run,
    for counting runs, not for spacing. A moved readmit stays: it replaced the missed start.
    """
    entries = ledger(pool, bucket)
    entries = happened(entries) if readmits else one_per_run(entries)
    return sorted(
        int(fields["start"])
        for fields in entries
        if task_id is None or fields.get("task") == task_id
    )


def one_per_run(entries: list[dict[str, str]]) -> list[dict[str, str]]:
    """Of the starts that happened (``starts.happened``), one per run: a holder's new start
    after its admitted one passed unused, where the missed start still counts (a readmit that
    did not move it), is left out."""
    return [f for f in happened(entries) if not is_readmit(f) or is_moved(f)]


def happened_us(client: redis.Redis[Any], bucket: str) -> list[int]:
    """Store-clock times of ``bucket``'s starts that happened, from its ledger on ``client``'s
    server (a start its holder missed that a moved readmit replaced is left out)."""
    return sorted(int(f["start"]) for f in happened(ledger_entries(client, bucket)))


def run_starts_us(client: redis.Redis[Any], bucket: str) -> list[int]:
    """``happened_us``, one start per run (``one_per_run``): for counting runs."""
    return sorted(int(f["start"]) for f in one_per_run(ledger_entries(client, bucket)))


def claim_admissions_us(pool: Pool) -> list[tuple[int, int]]:
    """(when the store admitted it, the start it admitted), store-clock µs, of every OK claim of
    the pool's queue. A claim may come up to its lead before its start."""
    entries = pool.recorder.xrange(ledger_key(KEY_PREFIX, pool.queue))
    return sorted(
        (int(fields[b"now"]), int(fields[b"start"]))
        for _id, fields in entries
        if fields.get(b"op") == b"claim:OK"
    )


def bucket_claims(pool: Pool, bucket: str) -> list[tuple[int, str]]:
    """(store-clock start, task id) of every OK claim of ``bucket`` that happened (as
    ``claim_times_us``)."""
    return sorted((int(f["start"]), f["task"]) for f in happened(ledger(pool, bucket)))


def admitted_starts(pool: Pool) -> list[dict[str, Any]]:
    """The starts the store admitted (each claim:OK in the ledger, a pool process's new claim
    too): ``us`` the admitted start on the store's clock, ``id`` the task. A body begins at
    its admitted start, or later on a loaded machine; these are what a throttle governs."""
    entries = pool.recorder.xrange(ledger_key(KEY_PREFIX, pool.queue))
    return sorted(
        (
            {"us": int(fields[b"start"]), "id": fields[b"task"].decode()}
            for _id, fields in entries
            if fields.get(b"op") == b"claim:OK"
        ),
        key=lambda r: r["us"],
    )


def throttle_entries(pool: Pool, queue: str | None = None) -> list[dict[str, Any]]:
    """The ledger's throttles: when the store deferred the bucket (``now``), for how long
    (``retry_after``), for which task, at which interval."""
    entries = pool.recorder.xrange(ledger_key(KEY_PREFIX, queue or pool.queue))
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _id, fields in entries
        if fields.get(b"op") == b"throttle"
    ]


def starts_us(client: redis.Redis[Any]) -> list[int]:
    """The admitted starts of bucket api on the store's clock, from its ledger."""
    entries = client.xrange(ledger_key(KEY_PREFIX, "api"))
    return [int(f[b"start"]) for _id, f in entries if f[b"op"] == b"claim:OK"]
