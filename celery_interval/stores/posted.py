"""PostedLine: script calls to a standalone Redis written at once, their replies read later."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from celery_interval.stores.line import Call, packed

__all__ = ["MAX_OWED", "PostedLine"]

logger = logging.getLogger("celery_interval")

#: Replies a posted line may owe; more means the store stopped answering (the line resets).
MAX_OWED = 64
#: How often (seconds) ``settle`` tries again to reach a store it could not.
SETTLE_RETRY_S = 0.05


class PostedLine:
    """One connection of its own; ``post`` writes a call and returns without its reply.

    Once written, a call reaches Redis even if this process is killed the next instant: the
    kernel closes a dead process's socket after sending what it wrote. A script goes ahead of
    its first call on each connection (its load, in the same write); replies are read as the
    next call is posted, and a call whose program the server lost (flushed) is sent again
    behind its script. A call the store refused (out of memory, a failed disk save, an error
    in the script) is sent again too, at each ``prepare`` until it goes through: a done mark
    dropped would let a copy of its task run again. So is a call whose reply the connection
    took with it (the store restarted or hung up before it answered): a done mark is the same
    however often it is written.
    """

    def __init__(self, client: Any) -> None:
        self._pool = client.connection_pool
        self._conn: Any = None
        #: The call of each reply owed, None for a load's.
        self._owed: deque[Call | None] = deque()
        #: Scripts loaded on this connection (by sha).
        self._loaded: set[str] = set()
        #: Calls whose replies a lost connection took along: sent again on the next one.
        self._unsent: list[Call] = []
        #: Whether the last call the store answered was refused (logged once until one passes).
        self._refusing = False
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Before a start's wait: read the replies that came, and hold a live connection
        (connecting may take a round trip, or the store's timeout if it is down)."""
        with self._lock:
            if self._conn is not None:
                try:
                    self._collect()
                    return
                except (RedisConnectionError, OSError):
                    self._reset()  # closed by the server (idle timeout, restart): open another
                except BaseException:
                    self._reset()
                    raise
            self._conn = self._pool.get_connection()
            try:
                self._write_unsent()
            except BaseException:
                self._reset()
                raise

    def post(self, call: Call) -> None:
        """Write ``call`` on the prepared connection: never connects, never waits for a reply.
        With none (the store could not be reached as it was prepared), the call is owed: it
        goes with the next ``settle`` or ``prepare`` that reaches the store."""
        with self._lock:
            if self._conn is None:
                self._unsent = [*self._unsent, call][-MAX_OWED:]
                return
            try:
                self._write(call)
            except BaseException:
                self._reset()
                raise

    def settle(self, timeout_s: float) -> None:
        """After the body whose mark was posted: wait up to ``timeout_s`` for the replies owed,
        and send again, on a new connection, what a lost one took along. A mark written on a
        connection the store then cut (or that a proxy dropped) is otherwise sent again only
        with this process's next task: a worker killed before then leaves a copy with no mark.
        Gives up at once while the store refuses; one that cannot be reached is tried again
        every ``SETTLE_RETRY_S`` until ``timeout_s`` (then ``prepare`` tries again)."""
        deadline_s = time.monotonic() + timeout_s
        with self._lock:
            while (self._owed or self._unsent) and not self._refusing:
                left_s = deadline_s - time.monotonic()
                if left_s <= 0:
                    return
                try:
                    if self._conn is None:
                        self._conn = self._pool.get_connection()
                        self._write_unsent()
                    elif self._conn.can_read(timeout=left_s):
                        self._collect()
                except (RedisConnectionError, RedisTimeoutError, OSError):
                    connected = self._conn is not None
                    self._reset()
                    if not connected:  # the store cannot be reached now
                        time.sleep(max(0.0, min(SETTLE_RETRY_S, deadline_s - time.monotonic())))
                except BaseException:
                    self._reset()
                    raise

    def _write_unsent(self) -> None:
        """Write the calls a lost connection took along; after a failed write, those not
        written stay owed."""
        unsent, self._unsent = self._unsent, []
        for i, call in enumerate(unsent):
            try:
                self._write(call)
            except BaseException:
                self._unsent = [*self._unsent, *unsent[i + 1 :]][-MAX_OWED:]
                raise

    def _write(self, call: Call) -> None:
        script, keys, args = call
        try:  # a program chosen as its first call is written may raise: the call stays owed
            sha = script.sha
            loads = sha not in self._loaded
            commands = [script.load()] if loads else []
            commands.append(script.call(keys, args))
        except BaseException:
            self._unsent = [*self._unsent, call][-MAX_OWED:]
            raise
        if loads:
            self._owed.append(None)
            self._loaded.add(sha)
        self._owed.append(call)
        # No health check: its PING would wait on a slow store and take an owed reply.
        self._conn.send_packed_command(packed(commands), check_health=False)

    def _collect(self) -> None:
        """Read every reply that has arrived; send again the calls Redis had no script for.
        A socket the server closed raises here (``can_read`` sees its end)."""
        again: list[Call] = []
        while self._conn.can_read(timeout=0):
            if not self._owed:
                raise RedisConnectionError("the store sent a reply nothing asked for")
            call = self._owed.popleft()
            try:
                self._conn.read_response()
            except ResponseError as exc:
                if call is not None and call[0].missing(exc):
                    self._loaded.discard(call[0].sha)
                    again.append(call)
                elif call is not None:
                    self._refused(exc)
                    again.append(call)
            else:
                if call is not None and self._refusing:
                    self._refusing = False
                    logger.warning("interval: the store takes posted done marks again")
        if len(self._owed) >= MAX_OWED:
            raise RedisTimeoutError(f"the store owes {len(self._owed)} replies")
        for call in again:
            self._write(call)

    def _refused(self, exc: ResponseError) -> None:
        if not self._refusing:
            self._refusing = True
            logger.error(
                "interval: the store refused a posted done mark (%s): it is sent again with "
                "this process's next task until the store takes it",
                exc,
            )

    def _reset(self) -> None:
        self._unsent = [*self._unsent, *(c for c in self._owed if c is not None)][-MAX_OWED:]
        self._owed.clear()
        self._loaded.clear()
        if self._conn is not None:
            self._conn.disconnect()
            self._pool.release(self._conn)
            self._conn = None
