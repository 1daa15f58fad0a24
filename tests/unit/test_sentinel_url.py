"""Sentinel store URLs: their parts, the options they give, and errors naming them masked."""

from __future__ import annotations

import pytest
import redis
from redis.sentinel import SentinelConnectionPool, SentinelManagedSSLConnection

from celery_interval.errors import ConfigurationError
from celery_interval.stores import mask_url, store_from_url
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.sentinel import SentinelTarget, sentinel_target
from celery_interval.stores.urls import parse_store_url


@pytest.mark.parametrize(
    ("url", "target"),
    [
        (
            "redis+sentinel://10.0.0.1:26379/mymaster",
            SentinelTarget([("10.0.0.1", 26379)], "mymaster", {}, {}),
        ),
        (
            "redis+sentinel://:pw@s1:5000,s2:5001,s3/ci/2",
            SentinelTarget(
                [("s1", 5000), ("s2", 5001), ("s3", 26379)], "ci", {"password": "pw", "db": 2}, {}
            ),
        ),
        (
            "redis+sentinel://ci:pw@s1:5000/ci?sentinel_password=spw&sentinel_username=sen"
            "&socket_keepalive=true",
            SentinelTarget(
                [("s1", 5000)],
                "ci",
                {"username": "ci", "password": "pw", "socket_keepalive": True},
                {"password": "spw", "username": "sen"},
            ),
        ),
        (
            "rediss+sentinel://s1:5000/ci?ssl_cert_reqs=none",
            SentinelTarget(
                [("s1", 5000)],
                "ci",
                {"ssl_cert_reqs": "none", "ssl": True},
                {"ssl": True, "ssl_cert_reqs": "none"},
            ),
        ),
    ],
)
def test_sentinel_urls_are_split_into_their_parts(url: str, target: SentinelTarget) -> None:
    assert parse_store_url(url).kind == "sentinel"
    assert sentinel_target(url, mask_url(url)) == target


def test_a_sentinel_store_is_a_standalone_redis_store_on_the_sentinels_master() -> None:
    """No I/O when made; the client is a plain redis.Redis on a Sentinel pool, so the store
    keeps its birth marker and its one-round-trip script line, as on a single Redis."""
    store = store_from_url("rediss+sentinel://:s3cret@127.0.0.1:1,127.0.0.1:2/ci/3")
    assert isinstance(store, RedisStore)
    client = store.client()
    assert type(client) is redis.Redis
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "ci"
    assert pool.connection_class is SentinelManagedSSLConnection
    assert pool.connection_kwargs["db"] == 3 and pool.connection_kwargs["password"] == "s3cret"
    assert [
        s.connection_pool.connection_kwargs["port"] for s in pool.sentinel_manager.sentinels
    ] == [
        1,
        2,
    ]
    assert store.posts_done
    assert store.born_keys() == ["ci:{~born}"]


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis+sentinel://s1:26379", "names no service"),
        ("redis+sentinel://s1:26379/", "names no service"),
        ("redis+sentinel://:s3cret@s1:notaport/ci", "bad sentinel 's1:notaport'"),
        ("redis+sentinel://s1:26379,:26380/ci", "bad sentinel ':26380'"),
        ("redis+sentinel://s1:26379,/ci", "bad sentinel ''"),
        ("redis+sentinel://s1:/ci", "bad sentinel 's1:'"),
        ("redis+sentinel:///ci", "bad sentinel ''"),
        ("redis+sentinel://:s3cret@s1:26379/ci/zero", "/service_name/db"),
        ("redis+sentinel://s1:26379/ci/0/1", "/service_name/db"),
        ("redis+sentinel://s1:26379/ci?sentinel_password=s3cret&ssl_ca_cert=x", "ssl_ca_cert"),
        ("rediss+sentinel://:s3cret@s1:26379/ci?ssl_ca_certs=/no/ca.pem", "does not exist"),
        ("redis+sentinel//s1:26379/ci", "has no scheme"),
        ("redis+sentinel:s1:26379/ci", "expected redis+sentinel://"),
    ],
)
def test_malformed_sentinel_urls_are_named_with_passwords_masked(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        store_from_url(url)
    message = str(excinfo.value)
    assert named in message and mask_url(url) in message and "s3cret" not in message


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis+sentinel://:pw@s1:1,s2:2/ci", "redis+sentinel://:***@s1:1,s2:2/ci"),
        (
            "redis+sentinel://u:pw@s1:1/ci?sentinel_password=spw&db=1",
            "redis+sentinel://u:***@s1:1/ci?sentinel_password=***&db=1",
        ),
    ],
)
def test_sentinel_passwords_are_masked(url: str, masked: str) -> None:
    assert mask_url(url) == masked
