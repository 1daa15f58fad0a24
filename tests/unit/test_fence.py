"""The failover fence: a state saved by another master is fenced; a single Redis never looks."""

from __future__ import annotations

from typing import Any

import redis

from celery_interval import schedule
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.keys import state_key
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.scripts import script_source
from tests.helpers.store_exercise import exercise

I_US = 1_000_000
T0 = 1_700_000_000_000_000
ML = schedule.MAX_LEAD_US


def test_a_fenced_state_starts_no_sooner_than_an_interval_after_now_and_the_lead() -> None:
    """A start the old master admitted before now lay at most MAX_LEAD_US ahead: the first
    start a fenced state admits is one interval after that, whatever the state remembered.
    Epoch, tickets, pause and overrides are kept, and fencing twice changes nothing more."""
    state = schedule.new_state(T0, I_US, born_us=0)
    state, _, first = schedule.grant(state, None, T0, Pace(I_US), born_us=0)
    state, _, claimed = schedule.claim(
        state, None, T0, I_US, first.slot, ClaimTerms("h", I_US), born_us=0
    )
    assert claimed.outcome is Outcome.OK
    now = T0 + 5 * I_US  # long idle: without the fence the next start would be now
    fenced = schedule.fenced(state, now, I_US)
    assert fenced.last_start_us == now + ML and fenced.tat_us == now + ML + I_US
    assert (fenced.epoch, fenced.ticket, fenced.current_slot_us) == (
        state.epoch,
        state.ticket,
        state.current_slot_us,
    )
    assert schedule.fenced(fenced, now, I_US) == fenced
    _, _, grant = schedule.grant(fenced, None, now, Pace(I_US), born_us=0)
    assert grant.delay_us == ML + I_US
    recent = schedule.fenced(state, T0 + 10, I_US)  # its last start is still ahead: kept
    assert recent.last_start_us == max(state.last_start_us, T0 + 10 + ML)


def test_the_lua_fence_matches_the_model(cluster_client: redis.RedisCluster[Any]) -> None:
    """On a fenced store (a Cluster), a state whose saver's replication id is not this
    master's (as on a promoted replica) is fenced at its next script, as ``schedule.fenced``
    says; the epoch stays and the state then carries this master's id."""
    cluster_client.flushdb()
    now = [T0]
    store = RedisStore(cluster_client, now_us=lambda: now[0])
    assert store.fenced
    copy = TaskCopy("api", "t1", 0)
    store.take(copy, Pace(I_US), ClaimTerms("h", I_US))
    before = store.read_state("api")
    assert before is not None
    key = state_key("ci:", "api")
    replid = cluster_client.info("replication")["master_replid"]
    assert cluster_client.hget(key, "m") == replid.encode()
    now[0] = T0 + 5 * I_US
    store.grant(TaskCopy("api", "t2", 0), Pace(I_US))  # the same master: no fence
    unfenced = store.read_state("api")
    assert unfenced is not None and unfenced.last_start_us == before.last_start_us
    cluster_client.hset(key, "m", "0" * 40)  # saved by another master
    grant = store.grant(TaskCopy("api", "t3", 0), Pace(I_US))
    after = store.read_state("api")
    expected = schedule.fenced(unfenced, now[0], I_US)
    assert after is not None
    assert (after.last_start_us, after.epoch) == (expected.last_start_us, before.epoch)
    assert grant.slot_us == max(expected.tat_us, now[0])
    assert cluster_client.hget(key, "m") == replid.encode()


def test_a_single_redis_store_never_asks_for_its_replication_id(
    redis_client: redis.Redis[Any],
) -> None:
    """The fence costs a standalone Redis nothing: its scripts never run INFO."""
    store = RedisStore(redis_client)
    assert not store.fenced
    assert "local FENCED = false" in script_source("grant")
    redis_client.config_resetstat()
    exercise(store, "api")
    assert "cmdstat_info" not in redis_client.info("commandstats")
