"""A Redis store's ping gets its calls ready: connected and the scripts loaded, so that no early
call's round trip (from which a worker maps the store's clock) carries that work."""

from __future__ import annotations

from typing import Any

from celery_interval.schedule import Pace
from celery_interval.schedule.state import MAX_LEAD_US, ClaimTerms
from celery_interval.stores import store_from_url
from celery_interval.stores.base import TaskCopy


def _script_loads(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_script", {}).get("calls", 0))


def _connections(client: Any) -> int:
    return int(client.info("stats")["total_connections_received"])


def test_after_a_ping_the_first_calls_load_nothing_and_connect_nothing(
    redis_server: Any, redis_client: Any
) -> None:
    redis_client.script_flush()  # as on a server just started
    store = store_from_url(redis_server.url)
    try:
        store.ping()
        loads, connections = _script_loads(redis_client), _connections(redis_client)
        terms = ClaimTerms("h1", 3_000_000, MAX_LEAD_US)
        taken, claimed = store.take(TaskCopy("b", "t1", 0), Pace(50_000), terms)
        assert claimed is not None or taken.delay_us > 0
        store.grant(TaskCopy("b", "t2", 0), Pace(50_000))
        assert _script_loads(redis_client) == loads, "a call carried a SCRIPT LOAD"
        assert _connections(redis_client) == connections, "a call carried a connect"
    finally:
        store.close()
