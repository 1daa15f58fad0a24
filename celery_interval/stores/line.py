"""ScriptLine: script calls to a standalone Redis sent back to back on one connection."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["Call", "ScriptLine", "packed"]

#: One script call: its program (``functions.Program``), keys, arguments.
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
    child, take one from the pool per batch. ``close`` (or the line's collection) returns it.

    A batch's calls run in order: each program goes ahead of its first call (its load, in the
    same write) until the line has seen it loaded on the server its connections reach.
    Resending only the calls that met NOSCRIPT would run them after the batch's later calls
    (a batch whose scripts the server only partly holds: a nested bucket's take among plain
    ones, the done calls ahead of a take)."""

    def __init__(self, client: Any) -> None:
        self._pool = client.connection_pool
        self._lock = threading.Lock()
        #: The shas of the scripts loaded on the server since the line's connections connected.
        self._loaded: set[str] = set()
        #: The connections whose (re)connects clear ``_loaded``.
        self._watched: weakref.WeakSet[Any] = weakref.WeakSet()
        #: (pid, thread id) of the thread that keeps ``_kept``.
        self._owner: tuple[int, int] | None = None
        self._kept: Any = None
        self._give_back: Any = None
        self._closed = False

    def run(self, calls: Sequence[Call]) -> list[Any]:
        """Each call's reply, in order; a call the script failed gets its ResponseError as its
        reply. A program the server lost (its scripts or functions flushed, a restart) is
        loaded again and the calls that met it resent once, behind it; a connection error or
        timeout resends the calls still without a reply once (as the client's one retry did),
        then raises."""
        conn = self._own_connection()
        if conn is None:
            conn = self._pool.get_connection()
            self._watch(conn)
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

    def load(self, scripts: Iterable[Any]) -> None:
        """Connect the connection this thread calls with and load ``scripts`` (programs) on its
        server, so that the first calls' round trips carry neither (a worker maps the store's
        clock from a call's round trip as if its script ran halfway through it). A script the server
        refuses here is refused again, with its error, at its first call."""
        conn = self._own_connection()
        pooled = conn is None
        if pooled:
            conn = self._pool.get_connection()
            self._watch(conn)
        try:
            conn.connect()
            loads = list({s.sha: s for s in scripts if s.sha not in self._loaded}.values())
            if loads:
                conn.send_packed_command(packed([s.load() for s in loads]))
                self._read_loads(conn, loads)
        except BaseException:
            conn.disconnect()
            if not pooled:
                self._give_back_kept()
            raise
        finally:
            if pooled:
                self._pool.release(conn)

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
            self._watch(conn)
            self._owner, self._kept = me, conn
            self._give_back = weakref.finalize(self, self._pool.release, conn)
            return conn

    def _watch(self, conn: Any) -> None:
        """Forget the loaded scripts when ``conn`` is new to the line, and whenever it connects
        again (a restarted server, or a new master, holds none or only another client's)."""
        if conn not in self._watched:
            self._watched.add(conn)
            conn.register_connect_callback(self._forget_loaded)
            self._loaded.clear()

    def _forget_loaded(self, _conn: Any = None) -> None:
        self._loaded.clear()

    def _exchange(self, conn: Any, calls: Sequence[Call]) -> list[Any]:
        replies: list[Any] = [_NO_REPLY] * len(calls)
        retried = reloaded = False
        while True:
            todo = [i for i, r in enumerate(replies) if r is _NO_REPLY]
            if not todo:
                return replies
            loads = list({calls[i][0].sha: calls[i][0] for i in todo
                          if calls[i][0].sha not in self._loaded}.values())  # fmt: skip
            commands = [script.load() for script in loads]
            commands += [calls[i][0].call(calls[i][1], calls[i][2]) for i in todo]
            try:
                conn.send_packed_command(packed(commands))
                refused = self._read_loads(conn, loads)
                for i in todo:
                    try:
                        replies[i] = conn.read_response()
                    except ResponseError as exc:
                        replies[i] = refused.get(calls[i][0].sha, exc)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                conn.disconnect()
                self._forget_loaded()
                if retried:
                    raise
                retried = True
                continue
            missing = [
                i
                for i in todo
                if isinstance(replies[i], ResponseError) and calls[i][0].missing(replies[i])
            ]
            if not missing or reloaded:
                return replies
            reloaded = True  # the scripts were flushed: load them ahead of the calls again
            self._forget_loaded()
            for i in missing:
                replies[i] = _NO_REPLY

    def _read_loads(self, conn: Any, loads: Sequence[Any]) -> dict[str, ResponseError]:
        """Read the loads' replies: the programs loaded join ``_loaded``; the others' errors
        by sha (their calls' replies)."""
        refused: dict[str, ResponseError] = {}
        for script in loads:
            try:
                conn.read_response()
            except ResponseError as exc:
                if not script.loaded_by(exc):
                    refused[script.sha] = exc
                    continue
            self._loaded.add(script.sha)
        return refused
