"""Script calls are packed by hiredis, byte for byte as redis-py packs them; a store refuses a
client that would encode its keys other than in UTF-8 (tests/integration/test_bad_input.py has
latin-1)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.connection import Connection

from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc
from celery_interval.errors import ConfigurationError
from celery_interval.schedule import Pace
from celery_interval.stores import store_from_url
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.keys import born_key
from celery_interval.stores.line import packed
from celery_interval.stores.redis import RedisStore

COMMANDS = [
    ("EVALSHA", "0" * 40, 3, "ci:{b}:state", "ci:{b}:m:t1:0", "ci:{b}:ledger", "", 10_000, 0),
    ("EVALSHA", "f" * 40, 1, "ci:{café}:m:é:2", "1700000000000000", -5, "w1@h/0a1b2c3d4e5f"),
    ("SCRIPT", "LOAD", "return redis.call('TIME') -- ünïcode"),
]


def test_hiredis_packs_script_calls_as_redis_py_does() -> None:
    conn = Connection()
    assert packed(COMMANDS) == [b"".join(conn.pack_commands(COMMANDS))]


def test_both_lines_write_utf8_keys(redis_server: RedisProc) -> None:
    raw: redis.Redis[Any] = redis.Redis.from_url(redis_server.url)
    raw.flushdb()
    store = RedisStore(redis.Redis.from_url(redis_server.url))
    try:
        store.grant(TaskCopy("café", "t1", 0), Pace(40_000))  # on the worker's line
        store.prepare_post()
        store.post_done(TaskCopy("café", "t2", 0), 60_000_000)  # on the posted line
        store.prepare_post()  # reads the post's reply
        assert store.read_mark("café", "t2", 0) is not None, "redis-py finds the posted mark"
    finally:
        store.close()
    keys = [k for k in raw.keys("*") if k != born_key(KEY_PREFIX).encode()]
    assert sum(b"t2" in k for k in keys) == 1, keys
    assert all("café".encode() in k for k in keys), keys


def test_utf8_spelled_otherwise_is_accepted_and_an_unknown_codec_is_not() -> None:
    store_from_url("redis://127.0.0.1:1/0?encoding=UTF8")
    with pytest.raises(ConfigurationError, match="encoding=no-such-codec: "):
        store_from_url("redis://127.0.0.1:1/0?encoding=no-such-codec")
