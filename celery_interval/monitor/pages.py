"""Each ledger's next page with its stream's info, one MULTI per stream, every stream of one
Redis node in one round trip (on a Redis Cluster a MULTI must keep to one hash slot)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import redis
from redis.exceptions import RedisClusterException, RedisError

__all__ = ["Page", "PageAsk", "group_by_node", "read_pages", "refresh_slots"]


class PageAsk(NamedTuple):
    """One stream's next page: at most ``limit`` entries from ``start`` (``-``: the oldest;
    ``(<id>``: after that entry)."""

    key: str
    start: str
    limit: int


class Page(NamedTuple):
    """A stream's page (``XRANGE``) and its ``XINFO STREAM`` from the same transaction; either
    is the error its command met instead (``XINFO`` of a stream that is gone)."""

    entries: list[tuple[Any, dict[Any, Any]]] | Exception
    info: dict[str, Any] | Exception


def group_by_node(client: Any, stream_keys: Sequence[str]) -> list[tuple[Any, list[int]]]:
    """The indexes of ``stream_keys`` per plain client of the node holding them: every key on
    ``client`` itself unless it is a ``RedisCluster``."""
    if not isinstance(client, redis.RedisCluster):
        return [(client, list(range(len(stream_keys))))] if stream_keys else []
    cluster: Any = client
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, key in enumerate(stream_keys):
        node = cluster.get_node_from_key(key)
        groups.setdefault(node.name, (cluster.get_redis_connection(node), []))[1].append(i)
    return list(groups.values())


def refresh_slots(client: Any) -> None:
    """Ask a Cluster for its slot map again (after a failover moved slots); no-op otherwise."""
    if isinstance(client, redis.RedisCluster):
        cluster: Any = client
        with contextlib.suppress(RedisError, RedisClusterException, OSError):
            cluster.nodes_manager.initialize()


def read_pages(node: redis.Redis, asks: Sequence[PageAsk]) -> list[Page]:
    """Each ask's ``Page``, sent to ``node`` as ``MULTI``, ``XRANGE``, ``XINFO STREAM``,
    ``EXEC`` per stream, all written at once and read back in order."""
    commands: list[tuple[Any, ...]] = []
    for ask in asks:
        commands += [
            ("MULTI",),
            ("XRANGE", ask.key, ask.start, "+", "COUNT", ask.limit),
            ("XINFO STREAM", ask.key),
            ("EXEC",),
        ]
    pool: Any = node.connection_pool
    conn: Any = pool.get_connection()
    try:
        replies: list[Any] = conn.retry.call_with_retry(
            lambda: _exchange(conn, commands, len(asks)), lambda _error: conn.disconnect()
        )
    except BaseException:
        conn.disconnect()  # replies may be left unread on it
        raise
    finally:
        pool.release(conn)
    callbacks: Any = node.response_callbacks
    pages = []
    for exec_reply in replies:
        page, info = exec_reply
        pages.append(
            Page(
                page if isinstance(page, Exception) else callbacks["XRANGE"](page),
                info if isinstance(info, Exception) else callbacks["XINFO STREAM"](info),
            )
        )
    return pages


def _exchange(conn: Any, commands: list[tuple[Any, ...]], streams: int) -> list[Any]:
    """Write ``commands`` and read the replies: of each stream's four, EXEC's."""
    conn.send_packed_command(conn.pack_commands(commands))
    replies = []
    for _ in range(streams):
        for _ in range(3):  # OK, QUEUED, QUEUED
            conn.read_response()
        replies.append(conn.read_response())
    return replies
