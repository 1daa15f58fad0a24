"""The ledger: one Stream entry per grant, claim and control action, written by the scripts."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_interval import schedule
from celery_interval.demo.embedded import RedisProc
from celery_interval.errors import ConfigurationError
from celery_interval.schedule import Claim, ClaimTerms, Grant, Outcome, Pace, Slot
from celery_interval.stores import store_from_url
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.memory import MemoryStore
from celery_interval.stores.redis import RedisStore
from tests.helpers.fakeclock import Clock

ML = schedule.MAX_LEAD_US
I_US = 1_000_000
T_US = 1_800_000_000_000_123  # 16 digits: Lua's default 14-digit formatting would round these
LEASE_US = 30_000_000


def fields_of(store: RedisStore, bucket: str) -> list[dict[str, str]]:
    return [fields for _id, fields in store.ledger(bucket)]


def grant_entry(
    task: str, r: int, ticket: int, slot: int, delay: int, **kw: object
) -> dict[str, str]:
    e = {"op": "grant:OK", "now": T_US, "task": task, "r": r, "ticket": ticket, "slot": slot,
         "delay": delay, "epoch": T_US, "paused": 0, "interval": I_US} | kw  # fmt: skip
    return {k: str(v) for k, v in e.items()}


def claim_entry(outcome: str, task: str, r: int, ticket: int, slot: int, holder: str,
                now: int, **extra: int) -> dict[str, str]:  # fmt: skip
    e = {"op": f"claim:{outcome}", "now": now, "task": task, "r": r, "ticket": ticket,
         "slot": slot, "holder": holder, "epoch": T_US, "interval": I_US} | extra  # fmt: skip
    return {k: str(v) for k, v in e.items()}


def control_entry(op: str, now: int, changed: int, interval: int, paused: int) -> dict[str, str]:
    e = {"op": op, "now": now, "changed": changed, "interval": interval, "paused": paused}
    return {k: str(v) for k, v in e.items()}


def test_every_operation_appends_its_entry(redis_client: redis.Redis[Any]) -> None:
    clock = Clock(T_US)
    store = RedisStore(redis_client, now_us=clock)
    model = MemoryStore(clock_us=clock)  # every result must still equal the pure model's

    def grant(task: str, r: int) -> Grant:
        g = store.grant(TaskCopy("api", task, r), Pace(I_US))
        assert g == model.grant(TaskCopy("api", task, r), Pace(I_US))
        return g

    def claim(task: str, r: int, epoch: int, slot: int, holder: str, ticket: int) -> Claim:
        args = (TaskCopy("api", task, r), I_US, Slot(epoch, slot), ClaimTerms(holder, LEASE_US, 10))
        c = store.claim(*args, ticket=ticket)
        assert c == model.claim(*args, ticket=ticket)
        return c

    slot1, slot2 = T_US + ML + I_US, T_US + ML + 2 * I_US  # a new epoch: max lead + interval
    g1, g2 = grant("t1", 0), grant("t2", 1)
    assert (g1.ticket, g1.slot_us, g2.ticket, g2.slot_us) == (1, slot1, 2, slot2)

    t_claim = clock.now_us = slot1 - 5  # within the lead of 10 µs: OK, start in 5 µs
    assert claim("t1", 0, T_US, slot1, "w1@h:1", 1) == Claim(Outcome.OK, T_US, 5, t_claim, T_US)
    again = claim("t1", 0, T_US, slot1, "w1@h:1", 1)  # a re-claim by the same holder
    assert again == Claim(Outcome.OK, T_US, 5, t_claim, T_US)
    assert claim("t2", 1, T_US, slot2, "w2|p", 2) == Claim(
        Outcome.WAIT, T_US, I_US + 5, t_claim, T_US
    )
    assert claim("t1", 0, T_US, slot1, "w2|p", 1) == Claim(
        Outcome.HELD, T_US, LEASE_US, t_claim, T_US
    )
    copy, terms = TaskCopy("api", "t1", 0), ClaimTerms("w2|p", LEASE_US, 10, 0)
    taken = store.take(copy, Pace(I_US), terms)  # no ticket: HELD
    assert taken == model.take(copy, Pace(I_US), terms)
    assert taken == (Grant(Outcome.HELD, T_US, 0, 0, LEASE_US, False), None)

    t_late = clock.now_us = slot2 + 250  # 250 µs after t2's slot (real = virtual here)
    assert claim("t2", 1, T_US, slot2, "w2|p", 2) == Claim(Outcome.OK, T_US, 0, t_late, T_US)
    for s in (store, model):
        s.done([TaskCopy("api", "t1", 0)], 10**9)  # done: no entry
    assert claim("t1", 0, T_US, slot1, "w3", 1).outcome is Outcome.DUPLICATE
    assert grant("t1", 0).outcome is Outcome.DUPLICATE
    assert claim("t3", 0, T_US - 1, slot2, "w1@h:1", 7).outcome is Outcome.RETICKET

    t_pause = clock.now_us = t_late + 100
    for _ in range(2):
        assert store.pause("api", I_US) == model.pause("api", I_US)
    assert claim("t3", 0, T_US, slot2, "w1@h:1", 7).outcome is Outcome.PAUSED
    g4 = grant("t4", 0)  # virtual time frozen at t_pause; tat is t2's slot + interval
    assert (g4.ticket, g4.slot_us, g4.delay_us, g4.paused) == (3, slot2 + I_US, I_US - 350, True)
    for _ in range(2):
        expected = model.set_interval("api", I_US, 2 * I_US)
        assert store.set_interval("api", I_US, 2 * I_US) == expected
    for _ in range(2):
        assert store.unset_interval("api", I_US) == model.unset_interval("api", I_US)
    t_unpause = clock.now_us = t_pause + 1_000
    for _ in range(2):
        assert store.unpause("api", I_US) == model.unpause("api", I_US)
    t_reset = clock.now_us = t_unpause + 1
    store.reset("api")

    assert fields_of(store, "api") == [
        grant_entry("t1", 0, 1, slot1, ML + I_US),
        grant_entry("t2", 1, 2, slot2, ML + 2 * I_US),
        claim_entry("OK", "t1", 0, 1, slot1, "w1@h:1", t_claim, start=slot1, late=0),
        claim_entry("OK", "t1", 0, 1, slot1, "w1@h:1", t_claim, start=slot1, late=0, again=1),
        claim_entry("WAIT", "t2", 1, 2, slot2, "w2|p", t_claim, delay=I_US + 5),
        claim_entry("HELD", "t1", 0, 1, slot1, "w2|p", t_claim, delay=LEASE_US),
        {
            "op": "grant:HELD",
            "now": str(t_claim),
            "task": "t1",
            "r": "0",
            "holder": "w2|p",
            "delay": str(LEASE_US),
            "epoch": str(T_US),
            "interval": str(I_US),
        },
        claim_entry("OK", "t2", 1, 2, slot2, "w2|p", t_late, start=t_late, late=250),
        claim_entry("DUPLICATE", "t1", 0, 1, slot1, "w3", t_late),
        grant_entry("t1", 0, 0, 0, 0, now=t_late, op="grant:DUPLICATE"),
        claim_entry("RETICKET", "t3", 0, 7, slot2, "w1@h:1", t_late),
        control_entry("pause", t_pause, 1, I_US, 1),
        control_entry("pause", t_pause, 0, I_US, 1),
        claim_entry("PAUSED", "t3", 0, 7, slot2, "w1@h:1", t_pause),
        grant_entry("t4", 0, 3, slot2 + I_US, I_US - 350, now=t_pause, paused=1),
        control_entry("set_interval", t_pause, 1, 2 * I_US, 1),
        control_entry("set_interval", t_pause, 0, 2 * I_US, 1),
        control_entry("unset_interval", t_pause, 1, I_US, 1),
        control_entry("unset_interval", t_pause, 0, I_US, 1),
        control_entry("unpause", t_unpause, 1, I_US, 0),
        control_entry("unpause", t_unpause, 0, I_US, 0),
        {"op": "reset", "now": str(t_reset)},
    ]
    raw: Any = redis_client.xrange(store.ledger_key("api"), count=1)
    assert raw[0][1][b"slot"] == str(T_US + ML + I_US).encode()  # to the µs
    assert store.ledger_key("api") == "ci:{api}:l"
    assert fields_of(store, "mail") == []


def test_new_epochs_are_logged_as_changes(redis_client: redis.Redis[Any]) -> None:
    clock = Clock(T_US)
    store = RedisStore(redis_client, now_us=clock)
    store.unpause("a", I_US)  # an unknown bucket gets a new epoch: a change
    store.set_interval("b", I_US, I_US)  # an override equal to the configured interval: a change
    store.set_interval("b", I_US, I_US)
    store.pause("c", I_US)
    store.unset_interval("d", I_US)  # no state: nothing to drop, and no state is made
    assert store.read_state("d") is None
    assert fields_of(store, "d") == [control_entry("unset_interval", T_US, 0, I_US, 0)]
    assert fields_of(store, "a") == [control_entry("unpause", T_US, 1, I_US, 0)]
    assert fields_of(store, "b") == [
        control_entry("set_interval", T_US, 1, I_US, 0),
        control_entry("set_interval", T_US, 0, I_US, 0),
    ]
    assert fields_of(store, "c") == [control_entry("pause", T_US, 1, I_US, 1)]


def _every_operation(store: RedisStore, bucket: str, clock: Clock | None = None) -> None:
    """Every store operation once; with an injected ``clock`` the first claim is OK."""
    g = store.grant(TaskCopy(bucket, "t1", 0), Pace(I_US))
    if clock is not None:
        clock.now_us = g.slot_us - ML  # a new epoch has no offset: real time = virtual time
    store.claim(
        TaskCopy(bucket, "t1", 0), I_US, g.slot, ClaimTerms("w1", LEASE_US, ML), ticket=g.ticket
    )
    store.claim(TaskCopy(bucket, "t1", 0), I_US, g.slot, ClaimTerms("w2", LEASE_US))
    store.done([TaskCopy(bucket, "t1", 0)], I_US)
    store.pause(bucket, I_US)
    store.set_interval(bucket, I_US, 2 * I_US)
    store.unset_interval(bucket, I_US)
    store.unpause(bucket, I_US)
    store.status(bucket, I_US)
    store.renew(bucket, "t1", 0, "w1", LEASE_US)
    store.reset(bucket)


def test_ledger_max_zero_writes_nothing(redis_client: redis.Redis[Any]) -> None:
    clock = Clock(T_US)
    store = RedisStore(redis_client, ledger_max=0, now_us=clock)
    _every_operation(store, "api", clock)
    assert store.read_state("api") is None  # the scripts ran (reset last)
    assert redis_client.exists(store.ledger_key("api")) == 0
    assert not [k for k in redis_client.keys("*") if redis_client.type(k) == b"stream"]
    assert store.ledger("api") == []


def test_an_idle_buckets_ledger_expires_a_week_after_its_last_entry(
    redis_client: redis.Redis[Any],
) -> None:
    from celery_interval.stores.redis_reads import LEDGER_TTL_MS

    store = RedisStore(redis_client)
    store.grant(TaskCopy("api:shop-1", "t1", 0), Pace(1_000_000))
    ttl_ms = redis_client.pttl(store.ledger_key("api:shop-1"))
    assert LEDGER_TTL_MS - 5_000 < ttl_ms <= LEDGER_TTL_MS
    redis_client.pexpire(store.ledger_key("api:shop-1"), 1_000)
    store.pause("api:shop-1", 1_000_000)  # every entry renews it
    assert redis_client.pttl(store.ledger_key("api:shop-1")) > LEDGER_TTL_MS - 5_000


def test_real_clock_entries(redis_client: redis.Redis[Any]) -> None:
    """Without an injected clock ``now`` is Redis TIME, in µs."""
    store = RedisStore(redis_client)
    seconds, micros = redis_client.time()
    _every_operation(store, "api")
    entries = fields_of(store, "api")
    assert [e["op"] for e in entries] == [  # a new epoch's first claim waits: max lead + I
        "grant:OK", "claim:WAIT", "claim:WAIT", "pause", "set_interval", "unset_interval",
        "unpause", "reset",
    ]  # fmt: skip
    nows = [int(e["now"]) for e in entries]
    assert nows == sorted(nows) and nows[0] >= seconds * 1_000_000 + micros
    assert nows[-1] - nows[0] < 10_000_000


def test_the_cap_trims_the_oldest_entries(redis_client: redis.Redis[Any]) -> None:
    store = RedisStore(redis_client, ledger_max=200, now_us=Clock(T_US))
    for i in range(1_000):
        store.grant(TaskCopy("api", f"t{i}", 0), Pace(I_US))
    length = redis_client.xlen(store.ledger_key("api"))
    assert 200 <= length <= 300  # MAXLEN ~ trims whole stream nodes (100 entries each)
    tickets = [int(f["ticket"]) for f in fields_of(store, "api")]
    assert tickets == list(range(1_001 - length, 1_001))  # the newest are kept, in order


def test_ledger_pages(redis_client: redis.Redis[Any]) -> None:
    store = RedisStore(redis_client, now_us=Clock(T_US))
    for i in range(5):
        store.grant(TaskCopy("api", f"t{i}", 0), Pace(I_US))
    first = store.ledger("api", count=2)
    assert [f["ticket"] for _id, f in first] == ["1", "2"]
    rest = store.ledger("api", start_id="(" + first[-1][0], count=10)
    assert [f["ticket"] for _id, f in rest] == ["3", "4", "5"]
    assert store.ledger("api", start_id="(" + rest[-1][0]) == []


def test_ledger_max_is_validated_and_passed_on(redis_server: RedisProc) -> None:
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ConfigurationError, match="ledger_max"):
            RedisStore.from_url(redis_server.url, ledger_max=bad)  # type: ignore[arg-type]
    store = store_from_url(redis_server.url, ledger_max=0)
    assert isinstance(store, RedisStore)
    store.grant(TaskCopy("off", "t1", 0), Pace(I_US))
    assert store.ledger("off") == []
    store.close()
    assert isinstance(store_from_url("memory://", ledger_max=5), MemoryStore)  # ignored


def test_ledger_lives_in_the_bucket_hash_slot(cluster_client: redis.RedisCluster[Any]) -> None:
    cluster_client.flushdb()
    clock = Clock(T_US)
    store = RedisStore(cluster_client, now_us=clock)
    for bucket in ("api", "mail|x", "tenant:42"):
        clock.now_us = T_US
        _every_operation(store, bucket, clock)  # each script's keys: state, mark, ledger
        ops = [f["op"] for f in fields_of(store, bucket)]
        assert ops == ["grant:OK", "claim:OK", "claim:HELD", "pause", "set_interval",
                       "unset_interval", "unpause", "reset"]  # fmt: skip
        node = cluster_client.get_default_node()
        slots = {
            cluster_client.execute_command("CLUSTER KEYSLOT", key, target_nodes=node)
            for key in (f"ci:{{{bucket}}}:s", store.ledger_key(bucket))
        }
        assert len(slots) == 1


def test_grants_and_claims_carry_the_effective_interval(redis_client: redis.Redis[Any]) -> None:
    """The audit reads the interval each start had to clear from the claim entry itself."""
    store = RedisStore(redis_client, now_us=Clock(T_US))
    store.set_interval("api", I_US, 3 * I_US)
    g = store.grant(TaskCopy("api", "t1", 0), Pace(I_US))
    store.claim(TaskCopy("api", "t1", 0), I_US, g.slot, ClaimTerms("w1", LEASE_US), ticket=g.ticket)
    entries = fields_of(store, "api")
    assert [e["op"] for e in entries] == ["set_interval", "grant:OK", "claim:WAIT"]
    assert [e["interval"] for e in entries] == [str(3 * I_US)] * 3
