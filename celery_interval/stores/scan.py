"""Buckets present in a store, found by SCAN, and many buckets' statuses in pipelined batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from fnmatch import fnmatchcase
from typing import Any

import redis

import celery_interval.stores.keys as keys
from celery_interval.schedule import Status
from celery_interval.stores.base import Store
from celery_interval.stores.codec import status_from_reply
from celery_interval.stores.memory import MemoryStore
from celery_interval.stores.redis import RedisStore, script_source

__all__ = ["SCAN_COUNT", "read_statuses", "store_buckets"]

#: Keys asked for per SCAN call.
SCAN_COUNT = 1000
#: Status scripts sent per pipeline (one round trip each).
STATUS_BATCH = 1000


def store_buckets(store: Store, match: str = "*") -> list[str] | None:
    """The sorted buckets with state in ``store`` whose names match the glob ``match``, or None
    when the store cannot list them (a file store). A Redis Cluster is scanned on every
    primary; read-only, never KEYS."""
    if isinstance(store, RedisStore):
        client, prefix = store.client(), store.prefix
        found: set[str] = set()
        with store.guard("scan"):
            for node in _primaries(client):
                for key in node.scan_iter(
                    match=keys.state_key_pattern(prefix, match), count=SCAN_COUNT, _type="hash"
                ):
                    bucket = keys.bucket_of_state_key(prefix, key)
                    if bucket is not None:
                        found.add(bucket)
        return sorted(found)
    if isinstance(store, MemoryStore):
        return sorted(b for b in store.buckets() if fnmatchcase(b, match))
    return None


def read_statuses(
    store: Store, wanted: Sequence[tuple[str, int]], batch: int = STATUS_BATCH
) -> list[Status]:
    """The status of each ``(bucket, configured interval_us)``, in order. On Redis the status
    script runs in pipelines of ``batch`` calls per node, not one round trip per bucket."""
    if not isinstance(store, RedisStore):
        return [store.status(bucket, interval_us) for bucket, interval_us in wanted]
    client, prefix = store.client(), store.prefix
    now_arg = store.clock_arg()
    replies: list[Any] = [None] * len(wanted)
    with store.guard("status"):
        by_node: dict[int, tuple[Any, list[int]]] = {}
        for i, (bucket, _) in enumerate(wanted):
            node = _node_for(client, keys.state_key(prefix, keys.validate_bucket(bucket)))
            by_node.setdefault(id(node), (node, []))[1].append(i)
        for node, indexes in by_node.values():
            script = node.register_script(script_source("status"))
            for start in range(0, len(indexes), batch):
                chunk = indexes[start : start + batch]
                pipe = node.pipeline(transaction=False)
                for i in chunk:
                    bucket, interval_us = wanted[i]
                    bucket_keys = [keys.state_key(prefix, bucket), keys.places_key(prefix, bucket)]
                    script(keys=bucket_keys, args=[now_arg, interval_us], client=pipe)
                for i, reply in zip(chunk, pipe.execute()):
                    replies[i] = reply
    return [status_from_reply(reply) for reply in replies]


def _primaries(client: Any) -> Iterator[Any]:
    """A plain client of each node holding keys: every primary of a cluster, or ``client``."""
    if isinstance(client, redis.RedisCluster):
        cluster: Any = client
        for node in cluster.get_primaries():
            yield cluster.get_redis_connection(node)
    else:
        yield client


def _node_for(client: Any, key: str) -> Any:
    """A plain client of the node holding ``key``."""
    if isinstance(client, redis.RedisCluster):
        cluster: Any = client
        return cluster.get_redis_connection(cluster.get_node_from_key(key))
    return client
