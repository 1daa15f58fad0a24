"""A nested bucket's keys: its outer's tag first; the listings, statuses and ledgers find them."""

from __future__ import annotations

from typing import Any

import redis

from celery_interval.ledger import LedgerReader
from celery_interval.schedule import ClaimTerms, Pace
from celery_interval.schedule.outer import Outer
from celery_interval.stores import keys
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.scan import read_statuses, store_buckets

OUTERS = {"api:acme": Outer("api", 1_000)}


def test_a_nested_bucket_keys_start_with_its_outer_tag() -> None:
    assert keys.state_key("ci:", "api:acme", "api") == "ci:{api}{api:acme}:s"
    assert keys.mark_key("ci:", "api:acme", "t1", 0, "api") == "ci:{api}{api:acme}:m:t1:0"
    assert keys.ledger_key("ci:", "api:acme", "api") == "ci:{api}{api:acme}:l"
    assert keys.state_key("ci:", "api:acme") == "ci:{api:acme}:s", "a plain bucket's unchanged"
    assert keys.bucket_of_state_key("ci:", "ci:{api}{api:acme}:s") == "api:acme"
    assert keys.bucket_of_ledger_key("ci:", b"ci:{api}{api:acme}:l") == "api:acme"
    assert keys.state_key_pattern("ci:", "api:*", nested=True) == "ci:{*}{api:*}:s"


def test_listings_statuses_and_ledgers_find_nested_buckets(
    redis_client: redis.Redis[Any],
) -> None:
    store = RedisStore(redis_client, nesting=OUTERS.get)
    store.take(TaskCopy("api:acme", "t1", 0), Pace(1_000), ClaimTerms("w1", 10**6))
    store.take(TaskCopy("mail", "t1", 0), Pace(1_000), ClaimTerms("w1", 10**6))
    assert redis_client.exists("ci:{api}{api:acme}:s", "ci:{api}:s", "ci:{mail}:s") == 3
    assert store_buckets(store) == ["api", "api:acme", "mail"]
    assert store_buckets(store, "api:*") == ["api:acme"]
    (status,) = read_statuses(store, [("api:acme", Pace(1_000))])
    assert status.exists and status.ticket == 1
    reader = LedgerReader(redis_client, nesting=OUTERS.get)
    assert reader.buckets() == ["api:acme", "mail"]
    assert [e["op"] for e in reader.entries("api:acme")][:1] == ["grant:OK"]
