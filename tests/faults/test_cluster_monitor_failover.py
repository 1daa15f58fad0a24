"""The exporter's ledger tail across a Redis Cluster failover: the master of some buckets
SIGKILLed, its replica promoted; the tail reads on from the new master, nothing counted twice."""

from __future__ import annotations

import contextlib
import time

import redis

from celery_interval.errors import StoreUnavailable
from celery_interval.ledger import LedgerReader
from celery_interval.monitor.tail import LedgerTail
from tests.helpers.clusters import ledger_buckets_per_master
from tests.helpers.failover import replicated_cluster, slot_owner, wait_cluster_promoted
from tests.helpers.hand_entries import I_US, T0, claim_ok


def test_the_tail_reads_on_from_the_promoted_replica() -> None:
    with replicated_cluster() as (masters, replicas):
        client = redis.RedisCluster(host="127.0.0.1", port=masters[0].port, socket_timeout=1.0)
        reader = LedgerReader(client)
        buckets = [f"b{i}" for i in range(60)]
        for bucket in buckets:
            client.xadd(reader.ledger_key(bucket), claim_ok("t0", T0))  # type: ignore[arg-type]
        tail = LedgerTail(reader)
        tail.follow(buckets)
        assert tail.poll() == len(buckets)
        for bucket in buckets:
            client.xadd(reader.ledger_key(bucket), claim_ok("t1", T0 + I_US))  # type: ignore[arg-type]
        for master in masters:  # every write on its replica before the kill
            with contextlib.closing(redis.Redis(port=master.port)) as plain:
                assert plain.execute_command("WAIT", 1, 10_000) == 1
        victim = slot_owner(masters, reader.ledger_key("b0"))
        moved = ledger_buckets_per_master(masters)[victim]
        assert "b0" in moved and len(moved) < len(buckets)
        masters[victim].kill()
        wait_cluster_promoted(replicas[victim])
        failed = 0
        deadline = time.monotonic() + 30
        while True:
            try:
                read = tail.poll()
                break
            except StoreUnavailable:
                failed += 1
                assert time.monotonic() < deadline, "the tail never read from the new master"
                time.sleep(0.2)
        assert read == len(buckets) and failed <= 5  # each failed read asks for the slot map anew
        assert {b: t.starts for b, t in tail.tallies.items()} == dict.fromkeys(buckets, 2)
        assert all(c.gaps == 0 and c.lost == 0 for c in tail.cursors.values())
        client.close()
