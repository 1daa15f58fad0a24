"""One interval for a whole pool: real `celery worker` processes, real brokers, Redis store."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest

from tests.helpers.pool import Pool, celery_cli, gaps_us

pytestmark = pytest.mark.slow

INTERVAL_S = 0.02


def body_floor_us(interval_s: float) -> int:
    """Body starts may come this close: the interval less what OS scheduling can add."""
    return round((interval_s - max(0.1 * interval_s, 0.003)) * 1e6)


def late_us(interval_s: float) -> int:
    """A wake later than this can put a body start below the floor."""
    return round(interval_s * 1e6) - body_floor_us(interval_s)


#: Share of body-start gaps that must clear the floor on a quiet machine. This VM wakes a
#: sleeping process more than 3 ms late in ~1.6 % of sleeps even when idle (bench/wakeup.py),
#: so a few bodies start late whatever the library does; the deadlines it hands out, and that
#: no body starts before its deadline, are checked for every task.
BODY_FLOOR_SHARE = 0.97
#: A body's start waits on more wakes than the probe's one (the worker's timer, the hand-off to
#: the pool process, the pool process): each late wake of the probe beside the workers allows
#: this many more late starts, so a noisy machine (steal time) does not pass for a library fault.
NOISE_FACTOR = 2


def allowed_late_starts(
    pool: Pool, records: list[dict[str, Any]], interval_s: float, *, one_host_clock: bool = True
) -> tuple[float, str]:
    """How many starts may come late (quiet-machine share plus the noise measured meanwhile),
    and a line saying what the probe saw."""
    if one_host_clock:
        since_ns, until_ns = min(r["mono_ns"] for r in records), max(r["mono_ns"] for r in records)
    else:  # a faked worker's monotonic clock is not the probe's: take the probe's whole run
        since_ns, until_ns = 0, 2**63
    late, waits = pool.wake_noise(since_ns, until_ns, late_us(interval_s))
    share = late / waits if waits else 0.0
    allowed = ((1 - BODY_FLOOR_SHARE) + NOISE_FACTOR * share) * len(records)
    noise = f"the probe woke >{late_us(interval_s)}us late in {late} of {waits} waits"
    return allowed, f"{allowed:.1f} allowed; {noise}"


def assert_body_gaps(
    pool: Pool, records: list[dict[str, Any]], interval_s: float, *, one_host_clock: bool = True
) -> None:
    """Deadlines and body starts on this host's monotonic clock, or (``one_host_clock=False``:
    a worker's clocks are faked) body starts on the store's. What the library hands out is
    exact; how late the OS runs a body is compared with the probe beside the workers."""
    if one_host_clock:
        deadlines = sorted(r["deadline_ns"] // 1000 for r in records)
        deadline_gaps = [b - a for a, b in itertools.pairwise(deadlines)]
        # Every start deadline handed to a pool process clears the floor (the store-clock to
        # monotonic mapping is exact to within one round trip to the store).
        assert min(deadline_gaps) >= body_floor_us(interval_s), f"{min(deadline_gaps)}"
        early = [r for r in records if r["mono_ns"] < r["deadline_ns"]]
        assert not early, f"bodies started before their deadlines: {early[:3]}"
        body_gaps = gaps_us(records)
        late = sorted((r["mono_ns"] - r["deadline_ns"]) // 1000 for r in records)
        p50_us, p90_us = late[len(late) // 2], late[len(late) * 9 // 10]
        print(f"BODY LATENESS p50 {p50_us}us p90 {p90_us}us max {late[-1]}us after the deadlines")
    else:
        times = sorted(r["us"] for r in records)
        body_gaps = [b - a for a, b in itertools.pairwise(times)]
    too_close = [g for g in body_gaps if g < body_floor_us(interval_s)]
    allowed, noise = allowed_late_starts(pool, records, interval_s, one_host_clock=one_host_clock)
    print(f"BODY GAPS {len(too_close)} of {len(body_gaps)} below the floor; {noise}")
    assert len(too_close) <= allowed, (
        f"{len(too_close)} of {len(body_gaps)} body gaps below the floor ({noise}): "
        f"{sorted(too_close)[:5]}"
    )


def assert_spacing(
    pool: Pool, records: list[dict[str, Any]], interval_s: float, *, one_host_clock: bool = True
) -> None:
    """Claims exact on the store clock; body starts as ``assert_body_gaps`` checks them."""
    assert_body_gaps(pool, records, interval_s, one_host_clock=one_host_clock)
    claims = claim_times_us(pool)
    assert len(claims) >= len(records), f"{len(claims)} OK claims in the ledger"
    claim_gaps = [b - a for a, b in itertools.pairwise(claims)]
    assert min(claim_gaps) >= round(interval_s * 1e6), f"claim gap {min(claim_gaps)}us"


def assert_ticket_order(pool: Pool, records: list[dict[str, Any]], interval_s: float) -> None:
    """Start deadlines follow ticket order exactly; a body starts after a later ticket's only
    when its own start came a whole gap late, and such starts are few (``allowed_late_starts``)."""
    by_deadline = [r["ticket"] for r in sorted(records, key=lambda r: r["deadline_ns"])]
    assert by_deadline == sorted(by_deadline), f"deadlines are not in ticket order: {by_deadline}"
    by_start = [r["ticket"] for r in sorted(records, key=lambda r: r["mono_ns"])]
    passed = [b for a, b in itertools.pairwise(by_start) if b < a]
    allowed, noise = allowed_late_starts(pool, records, interval_s)
    assert len(passed) <= allowed, (
        f"tickets {passed} started after later ones ({noise}): {by_start}"
    )


def claim_times_us(pool: Pool, task_id: str | None = None, *, readmits: bool = True) -> list[int]:
    """Store-clock start times of every OK claim (of one task), read from the bucket's ledger.

    ``readmits=False`` leaves out a holder's new start after its admitted one passed unused (a
    pool process that came too late): for counting runs, not for spacing.
    """
    from celery_interval.config.table import KEY_PREFIX
    from celery_interval.stores.keys import ledger_key

    entries = pool.recorder.xrange(ledger_key(KEY_PREFIX, pool.queue))
    return sorted(
        int(fields[b"start"])
        for _id, fields in entries
        if fields.get(b"op") == b"claim:OK"
        and fields.get(b"again") != b"1"
        and (readmits or fields.get(b"readmit") != b"1")
        and (task_id is None or fields.get(b"task") == task_id.encode())
    )


def assert_exactly_once(records: list[dict[str, Any]], ids: list[str]) -> None:
    seen = [r["id"] for r in records]
    assert sorted(seen) == sorted(ids), (
        f"missing={set(ids) - set(seen)} doubled={[i for i in set(seen) if seen.count(i) > 1]}"
    )


def utilization(records: list[dict[str, Any]], interval_s: float) -> float:
    """How full the span of the starts the store admitted (the records' deadlines) was with
    one per interval: a slot that went unused lowers it; a body the OS ran late does not (how
    late bodies run is ``assert_body_gaps``'s)."""
    times = sorted(r["deadline_ns"] for r in records)
    return (len(times) - 1) * interval_s * 1e9 / (times[-1] - times[0])


@pytest.mark.parametrize(
    ("broker", "pool_type"),
    [("rabbitmq", "prefork"), ("redis", "prefork"), ("rabbitmq", "threads")],
)
def test_three_workers_hold_one_interval(make_pool: Any, broker: str, pool_type: str) -> None:
    pool = make_pool(INTERVAL_S, broker=broker)
    pool.start(3, concurrency=2, pool=pool_type)
    ids = pool.send(200)
    records = pool.wait_records(200)
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S)
    assert_ticket_order(pool, records, INTERVAL_S)
    assert utilization(records, INTERVAL_S) >= 0.95
    assert len({r["host"] for r in records}) == 3, "every worker should take part"


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_pause_and_unpause_through_the_cli(make_pool: Any, broker: str) -> None:
    # A small hold cap leaves tasks in the broker for the worker that starts while paused.
    pool = make_pool(INTERVAL_S, broker=broker, conf={"interval_max_held": 10})
    pool.start(3)
    # Enough tasks that the run after the unpause lasts seconds: the late worker learns of the
    # parked tasks within a poll or two and must take part.
    ids = pool.send(200)
    pool.wait_records(20, timeout_s=30)
    paused = celery_cli(pool, "control", "pause_queue", pool.queue, "--timeout", "2")
    assert paused.returncode == 0, paused.stderr
    paused_at_us = pool.store_now_us()
    replies = [ln for ln in paused.stdout.splitlines() if ln.startswith("->")]
    assert len(replies) == 3, paused.stdout
    time.sleep(1.0)
    late = pool.start(1)[0]  # a worker started while paused stays paused
    time.sleep(1.0)
    unpaused_at_us = pool.store_now_us()
    started_while_paused = [r for r in pool.records() if paused_at_us <= r["us"] <= unpaused_at_us]
    assert not started_while_paused, started_while_paused[:3]
    resumed = celery_cli(pool, "control", "unpause_queue", pool.queue, "--timeout", "2")
    assert resumed.returncode == 0, resumed.stderr
    records = pool.wait_records(200)
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S)
    assert any(r["host"] == late.name for r in records), "the late worker never ran a task"


def test_unknown_queue_is_an_error_reply(make_pool: Any) -> None:
    pool = make_pool(INTERVAL_S)
    pool.start(1)
    result = celery_cli(pool, "control", "pause_queue", "nope", "--timeout", "2")
    assert "unknown interval bucket 'nope'" in result.stdout + result.stderr
    assert pool.queue in result.stdout + result.stderr


def test_set_interval_mid_run_for_the_whole_pool(make_pool: Any) -> None:
    pool = make_pool(INTERVAL_S)
    pool.start(3)
    ids = pool.send(300)
    pool.wait_records(15, timeout_s=30)
    result = celery_cli(pool, "control", "set_interval", pool.queue, "0.05", "--timeout", "2")
    assert result.returncode == 0, result.stderr
    changed_at_us = pool.store_now_us()
    records = pool.wait_records(300)
    assert_exactly_once(records, ids)
    after = [t for t in claim_times_us(pool) if t > changed_at_us + 50_000]  # store clock
    assert len(after) > 10
    assert min(b - a for a, b in itertools.pairwise(after)) >= 50_000


def test_unset_interval_reaches_every_worker(make_pool: Any) -> None:
    """`celery control unset_interval`: each worker drops the override in the store (the first
    finds it, the others find none), the epoch stays, and starts go back to the configured
    spacing."""
    import celery_interval
    from celery_interval.config.table import KEY_PREFIX
    from celery_interval.stores.keys import ledger_key

    pool = make_pool(INTERVAL_S)
    pool.start(2)
    set_ = celery_cli(pool, "control", "set_interval", pool.queue, "0.05", "--timeout", "2")
    assert set_.returncode == 0, set_.stderr
    before = celery_interval.status(pool.app, pool.queue)
    assert (before.overridden, before.interval_us) == (True, 50_000)
    result = celery_cli(pool, "control", "unset_interval", pool.queue, "--timeout", "2")
    assert result.returncode == 0, result.stderr
    replies = [ln for ln in result.stdout.splitlines() if ln.startswith("->")]
    assert len(replies) == 2 and all(ln.endswith("OK") for ln in replies), result.stdout
    unset_at_us = pool.store_now_us()
    after = celery_interval.status(pool.app, pool.queue)
    assert (after.overridden, after.interval_us) == (False, round(INTERVAL_S * 1e6))
    assert after.epoch == before.epoch, "no new epoch"
    entries = pool.recorder.xrange(ledger_key(KEY_PREFIX, pool.queue))
    changed = [f[b"changed"] for _id, f in entries if f[b"op"] == b"unset_interval"]
    assert sorted(changed) == [b"0", b"1"], "one entry per worker, one of them dropped it"
    ids = pool.send(60)
    records = pool.wait_records(60)
    assert_exactly_once(records, ids)
    gaps = [b - a for a, b in itertools.pairwise(claim_times_us(pool)) if a > unset_at_us]
    assert len(gaps) >= 50
    assert 20_000 <= min(gaps) < 50_000, "the configured 20 ms spacing is back"


def test_revoke_retry_tenants_and_plain_tasks(make_pool: Any) -> None:
    pool = make_pool(INTERVAL_S, env_extra={"CI_TEST_TENANT_INTERVAL": "0.1"})
    pool.start(3)
    ids = pool.send(40)
    revoked = ids[30]
    pool.app.control.revoke(revoked)
    retried = pool.app.send_task(
        "workerapp.record", args=(1000,), kwargs={"fail_times": 2}, queue=pool.queue
    ).id
    with pool.app.producer_or_acquire() as producer:
        for i in range(10):
            for tenant in ("a", "b"):
                pool.app.send_task(
                    "workerapp.tenant", args=(tenant, i), queue=pool.queue, producer=producer
                )
    plain_sent_us = pool.store_now_us()
    pool.app.send_task("workerapp.plain", args=(0,), queue=f"{pool.queue}-plain")
    starts = pool.wait_records(39 + 3)
    assert revoked not in {r["id"] for r in starts}
    assert len([r for r in starts if r["id"] == retried]) == 3
    tries = claim_times_us(pool, task_id=retried, readmits=False)  # each try's start
    assert len(tries) == 3 and min(b - a for a, b in itertools.pairwise(tries)) >= 20_000
    assert len({r["ticket"] for r in starts if r["id"] == retried}) == 3, "each retry a new ticket"
    tenants = pool.wait_records(20, kind="tenant")
    for tenant in ("a", "b"):
        times = sorted(r["us"] for r in tenants if r["args"][0] == tenant)
        assert len(times) == 10
        assert min(b - a for a, b in itertools.pairwise(times)) >= body_floor_us(0.1)
    plain = pool.wait_records(1, kind="plain")
    assert plain[0]["us"] - plain_sent_us < 500_000, "a plain task waited behind interval tasks"


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_busy_pools_keep_body_start_spacing(make_pool: Any, broker: str) -> None:
    pool = make_pool(INTERVAL_S, broker=broker)
    pool.start(3, concurrency=2)
    ids = pool.send(80, sleep_s=8 * INTERVAL_S)
    records = pool.wait_records(80)
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S)


def test_a_worker_with_a_wrong_wall_clock(make_pool: Any, faketime_env: dict[str, str]) -> None:
    pool = make_pool(INTERVAL_S)
    pool.start(2)
    skewed = pool.start(1, **faketime_env)[0]
    ids = pool.send(100)
    records = pool.wait_records(100)
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S, one_host_clock=False)
    assert any(r["host"] == skewed.name for r in records), "the skewed worker never ran a task"


#: The countdown of the ETA task: it must still be "eta" when the ``celery inspect`` process,
#: slow to start on a loaded machine, asks.
LATE_S = 6


def _held_ids(pool: Pool, worker: str) -> set[str]:
    """The ids of the tasks ``worker`` holds in the pool's bucket (``interval_stats``)."""
    replies = pool.app.control.broadcast(
        "interval_stats", reply=True, destination=[worker], limit=1, timeout=5
    )
    held = [r[worker].get(pool.queue, {}).get("held_tasks", []) for r in replies if worker in r]
    return {h["id"] for hs in held for h in hs}


def test_inspect_countdown_override_and_timeout_warning(make_pool: Any) -> None:
    """Held tasks show in `inspect interval_stats`, with a ticket for each free pool process and
    the rest queued; a countdown task takes its ticket when due and its slot is not before it;
    a per-call bucket override gets its own bucket; a too-long hold is warned about at start."""
    pool = make_pool(
        INTERVAL_S, broker="redis", conf={"interval_broker_timeout_s": 1.0}, loglevel="INFO"
    )
    worker = pool.start(1)[0]
    # 40 held tasks at 50 ms: the last waits 2 s (interval_hold_ahead_s)
    assert "may wait 2s, longer than the broker's redelivery timeout 1s" in worker.log()
    assert celery_cli(pool, "control", "pause_queue", pool.queue).returncode == 0
    sent_us = pool.store_now_us()
    ids = pool.send(3)
    late = pool.app.send_task("workerapp.record", args=(99,), countdown=LATE_S, queue=pool.queue).id
    vip = f"{pool.queue}:vip"  # a bucket of its own, with the queue's interval
    other = pool.app.send_task(
        "workerapp.record", args=(98,), queue=pool.queue, headers={"interval_bucket": vip}
    ).id
    deadline = time.monotonic() + 30
    while _held_ids(pool, worker.name) != {*ids, late}:  # every task has reached the worker
        assert time.monotonic() < deadline, _held_ids(pool, worker.name)
        time.sleep(0.1)
    stats = celery_cli(pool, "inspect", "interval_stats", "--json", "--timeout", "2")
    assert stats.returncode == 0, stats.stderr
    per_bucket = json.loads(stats.stdout)[worker.name]
    held = per_bucket[pool.queue]["held_tasks"]
    assert {h["id"] for h in held} == {*ids, late}
    by_held_id = {h["id"]: h for h in held}
    assert [by_held_id[i]["ticket"] for i in ids] == [1, 2, 0], held  # -c 2: two tickets
    assert (by_held_id[ids[2]]["state"], by_held_id[late]["state"]) == ("queued", "eta"), held
    assert per_bucket[pool.queue]["paused"] is True
    assert celery_cli(pool, "control", "unpause_queue", pool.queue).returncode == 0
    records = pool.wait_records(5)
    by_id = {r["id"]: r for r in records}
    assert by_id[late]["us"] - sent_us >= LATE_S * 1_000_000, "the countdown was not honoured"
    assert other in by_id and f"interval {vip}: task {other} ticket 1" in worker.log()
    assert f"interval {pool.queue}: task {ids[0]} ticket 1" in worker.log()


def test_a_busy_pool_claims_its_own_tickets_in_order(make_pool: Any) -> None:
    """One worker, one pool process, bodies 4x the interval: every task is due while the pool
    is busy. The worker claims them lowest ticket first, so it never passes its own tickets
    (a pass would re-ticket them to the tail)."""
    pool = make_pool(0.005)
    pool.start(1, concurrency=1)
    ids = pool.send(40, sleep_s=0.02)
    records = pool.wait_records(40)
    assert_exactly_once(records, ids)
    from celery_interval.config.table import KEY_PREFIX
    from celery_interval.stores.keys import ledger_key

    ops = [f[b"op"] for _id, f in pool.recorder.xrange(ledger_key(KEY_PREFIX, pool.queue))]
    assert ops.count(b"claim:RETICKET") == 0, f"{ops.count(b'claim:RETICKET')} re-tickets"
    tickets = [r["ticket"] for r in sorted(records, key=lambda r: r["mono_ns"])]
    assert tickets == sorted(tickets)
