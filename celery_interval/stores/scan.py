"""Buckets present in a store, found by SCAN, and many buckets' statuses in pipelined batches."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from fnmatch import fnmatchcase
from typing import Any

import redis

import celery_interval.stores.keys as keys
from celery_interval.schedule import Pace, Status
from celery_interval.stores.base import Store
from celery_interval.stores.codec import status_from_reply, status_pace_args
from celery_interval.stores.memory import MemoryStore
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.scripts import script_source

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
            patterns = [keys.state_key_pattern(prefix, match)]
            if store.nests and match != "*":
                patterns.append(keys.state_key_pattern(prefix, match, nested=True))
            for node, pattern in itertools.product(list(_primaries(client)), patterns):
                for key in node.scan_iter(match=pattern, count=SCAN_COUNT, _type="hash"):
                    bucket = keys.bucket_of_state_key(prefix, key)
                    if bucket is not None:
                        found.add(bucket)
        return sorted(found)
    if isinstance(store, MemoryStore):
        return sorted(b for b in store.buckets() if fnmatchcase(b, match))
    return None


def read_statuses(
    store: Store, wanted: Sequence[tuple[str, Pace]], batch: int = STATUS_BATCH
) -> list[Status]:
    """The status of each ``(bucket, pace)`` (its configured interval, burst and extra limits:
    ``Store.status``), in order. On Redis the status script runs in pipelines of ``batch``
    calls per node, not one round trip per bucket."""
    if not isinstance(store, RedisStore):
        return [store.status(bucket, pace.interval_us, pace) for bucket, pace in wanted]
    client = store.client()
    now_arg = store.clock_arg()
    born = store.born_keys()
    replies: list[Any] = [None] * len(wanted)
    with store.guard("status"):
        by_node: dict[int, tuple[Any, list[int]]] = {}
        for i, (bucket, _) in enumerate(wanted):
            node = _node_for(client, store.status_keys(bucket)[0])
            by_node.setdefault(id(node), (node, []))[1].append(i)
        for node, indexes in by_node.values():
            script = node.register_script(script_source("status"))
            for start in range(0, len(indexes), batch):
                chunk = indexes[start : start + batch]
                pipe = node.pipeline(transaction=False)
                for i in chunk:
                    bucket, pace = wanted[i]
                    args = [now_arg, pace.interval_us, *status_pace_args(pace)]
                    bucket_keys = [*store.status_keys(bucket), *born]
                    script(keys=bucket_keys, args=args, client=pipe)
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
