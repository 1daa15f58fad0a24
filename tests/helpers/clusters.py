"""A private 3-master Redis Cluster (no replicas) for the tests of the commands that read a
Cluster store: the exporter, ``interval top`` and ``interval ledger export``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from celery_interval.demo.embedded import RedisProc
from tests.helpers.failover import assemble_cluster

__all__ = [
    "buckets_on",
    "cluster",
    "cluster_client_of",
    "flush",
    "ledger_buckets_per_master",
    "three_masters",
]


@contextlib.contextmanager
def three_masters(binary: str | None = None) -> Iterator[list[RedisProc]]:
    """Three private redis-servers (``binary``: default the one on PATH) in cluster mode
    forming one cluster, slots shared evenly."""
    with ThreadPoolExecutor(3) as executor:  # each start waits ~2 s for its one-node cluster
        nodes = list(executor.map(lambda _: RedisProc(binary=binary, cluster=True), range(3)))
    try:
        assemble_cluster(nodes)
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisProc]]:
    """Three private redis-servers in cluster mode forming one cluster (no replicas)."""
    with three_masters() as nodes:
        yield nodes


def cluster_client_of(nodes: list[RedisProc]) -> redis.RedisCluster[Any]:
    """A RedisCluster client of ``nodes`` (bytes replies, as the store's own client)."""
    return redis.RedisCluster(host="127.0.0.1", port=nodes[0].port)


def flush(nodes: list[RedisProc]) -> None:
    """Empty every node."""
    for node in nodes:
        with contextlib.closing(redis.Redis(port=node.port)) as client:
            client.flushall()


def ledger_buckets_per_master(nodes: list[RedisProc], prefix: str = "ci:") -> list[set[str]]:
    """The buckets whose ledger each master holds, asked of each node alone."""
    found = []
    for node in nodes:
        with contextlib.closing(redis.Redis(port=node.port, decode_responses=True)) as client:
            ledgers = client.scan_iter(match=f"{prefix}{{*}}:l", count=1000, _type="stream")
            found.append({key[len(prefix) + 1 : key.rindex("}")] for key in ledgers})
    return found


def buckets_on(client: redis.Redis[str], kind: str) -> set[str]:
    """Buckets with a key of ``kind`` (``s`` state, ``l`` ledger, ``m`` marks) on one node."""
    pattern = "ci:{*}:m:*" if kind == "m" else f"ci:{{*}}:{kind}"
    return {key[4 : key.index("}")] for key in client.scan_iter(match=pattern, count=1000)}
