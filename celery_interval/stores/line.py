"""ScriptLine: script calls to a standalone Redis sent back to back on one pooled connection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Call", "ScriptLine"]

#: One EVALSHA: a registered redis-py Script (its ``sha`` and ``script``), keys, arguments.
Call = tuple[Any, Sequence[str], Sequence[Any]]

_NO_REPLY = object()


class ScriptLine:
    """The worker's path to the store: one round trip per batch of calls, without redis-py's
    per-command retry wrapper and reply callbacks (about half of its CPU cost of a script
    call). A connection from the client's pool per batch: thread- and fork-safe."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._pool = client.connection_pool

    def run(self, calls: Sequence[Call]) -> list[Any]:
        """Each call's reply, in order; a call the script failed gets its ResponseError as its
        reply. NOSCRIPT loads the script and resends that call; a connection error or timeout
        resends the calls still without a reply once (as the client's one retry did), then
        raises."""
        replies: list[Any] = [_NO_REPLY] * len(calls)
        conn = self._pool.get_connection()
        try:
            retried = loaded = False
            while True:
                todo = [i for i, r in enumerate(replies) if r is _NO_REPLY]
                if not todo:
                    return replies
                try:
                    packed = [("EVALSHA", calls[i][0].sha, len(calls[i][1]), *calls[i][1],
                               *calls[i][2]) for i in todo]  # fmt: skip
                    conn.send_packed_command(conn.pack_commands(packed))
                    for i in todo:
                        try:
                            replies[i] = conn.read_response()
                        except ResponseError as exc:
                            replies[i] = exc
                except (RedisConnectionError, RedisTimeoutError, OSError):
                    conn.disconnect()
                    if retried:
                        raise
                    retried = True
                    continue
                missing = [i for i in todo if isinstance(replies[i], NoScriptError)]
                if not missing or loaded:
                    return replies
                loaded = True  # the server restarted or its scripts were flushed
                for script in {id(calls[i][0]): calls[i][0] for i in missing}.values():
                    script.sha = self._client.script_load(script.script)
                for i in missing:
                    replies[i] = _NO_REPLY
        finally:
            self._pool.release(conn)
