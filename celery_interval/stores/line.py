"""ScriptLine: script calls to a standalone Redis sent back to back on one connection."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Call", "ScriptLine", "packed"]

#: One EVALSHA: a registered redis-py Script (its ``sha`` and ``script``), keys, arguments.
Call = tuple[Any, Sequence[str], Sequence[Any]]
_NO_REPLY = object()


def packed(commands: Sequence[tuple[Any, ...]]) -> list[bytes]:
    """``commands`` in RESP, UTF-8: hiredis packs a whole command in one C call, where
    redis-py's packer runs Python per argument (RedisStore accepts only UTF-8 clients, so
    these are the bytes redis-py would send)."""
    return [b"".join([hiredis.pack_command(c) for c in commands])]


class ScriptLine:
    """The worker's path to the store: one round trip per batch of calls, without redis-py's
    per-command retry wrapper and reply callbacks (much of its CPU cost of a script call).
    The first thread to call keeps one connection of the client's pool for itself (a pool
    checkout and return per call costs a good part of the call); other threads, and a forked
    child, take one from the pool per batch. ``close`` (or the line's collection) returns it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._pool = client.connection_pool
        self._lock = threading.Lock()
        #: (pid, thread id) of the thread that keeps ``_kept``.
        self._owner: tuple[int, int] | None = None
        self._kept: Any = None
        self._give_back: Any = None
        self._closed = False

    def run(self, calls: Sequence[Call]) -> list[Any]:
        """Each call's reply, in order; a call the script failed gets its ResponseError as its
        reply. NOSCRIPT loads the script and resends that call; a connection error or timeout
        resends the calls still without a reply once (as the client's one retry did), then
        raises."""
        conn = self._own_connection()
        if conn is None:
            conn = self._pool.get_connection()
            try:
                return self._exchange(conn, calls)
            finally:
                self._pool.release(conn)
        try:
            return self._exchange(conn, calls)
        except BaseException:
            conn.disconnect()  # replies may be left unread
            self._give_back_kept()
            raise

    def close(self) -> None:
        """Return the kept connection to the pool."""
        with self._lock:
            self._closed = True
            if self._give_back is not None:
                self._give_back()
            self._owner = self._kept = self._give_back = None

    def _give_back_kept(self) -> None:
        """Return the kept connection after an error: the next call takes one from the pool,
        which connects it (a Sentinel pool asks where the master is now; a connection that
        reconnects by itself would go back to the old master's address)."""
        with self._lock:
            if self._give_back is not None:
                self._give_back()
            self._owner = self._kept = self._give_back = None

    def _own_connection(self) -> Any:
        """The kept connection if this thread keeps it (taking it on the first call)."""
        me = (os.getpid(), threading.get_ident())
        if self._owner == me:
            return self._kept
        with self._lock:
            if self._closed or (self._owner is not None and self._owner[0] == me[0]):
                return None  # closed, or another thread of this process keeps it
            conn = self._pool.get_connection()
            self._owner, self._kept = me, conn
            self._give_back = weakref.finalize(self, self._pool.release, conn)
            return conn

    def _exchange(self, conn: Any, calls: Sequence[Call]) -> list[Any]:
        replies: list[Any] = [_NO_REPLY] * len(calls)
        retried = loaded = False
        while True:
            todo = [i for i, r in enumerate(replies) if r is _NO_REPLY]
            if not todo:
                return replies
            try:
                commands = [("EVALSHA", calls[i][0].sha, len(calls[i][1]), *calls[i][1],
                             *calls[i][2]) for i in todo]  # fmt: skip
                conn.send_packed_command(packed(commands))
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
