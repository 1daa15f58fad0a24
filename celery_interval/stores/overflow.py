"""The overflow index: which buckets have tasks parked in the broker, and when to refill each."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import celery_interval.stores.keys as keys

__all__ = [
    "MemoryOverflowIndex",
    "OverflowIndex",
    "ParkedBucket",
    "RedisOverflowIndex",
    "overflow_index_for",
]


@dataclass(frozen=True)
class ParkedBucket:
    """One bucket with parked tasks: its queue, and the index's change count when it was read
    (a bucket found empty is dropped only if nobody parked into it since)."""

    queue: str
    bucket: str
    changes: int


class OverflowIndex(Protocol):
    """Every method is atomic on the store; all raise ``StoreUnavailable`` when it is down.

    A member is ``(queue, bucket)``; its score is the store time (µs) from which any worker
    may refill it. The change count of a bucket grows with every park into it.
    """

    def park(self, members: list[tuple[str, str]]) -> None:
        """Mark each member as holding parked tasks (due now unless already listed)."""
        ...

    def due(self, limit: int) -> list[ParkedBucket]:
        """Up to ``limit`` members due now, soonest first."""
        ...

    def changes(self, queue: str, bucket: str) -> int:
        """The member's change count (0 when it is not listed)."""
        ...

    def defer(self, queue: str, bucket: str, in_us: int) -> None:
        """Make the member due ``in_us`` from now (kept listed; no-op when not listed)."""
        ...

    def drop_if(self, queue: str, bucket: str, changes: int) -> bool:
        """Unlist the member if its change count is still ``changes`` and no worker holds
        tasks it took back from it (a live ``hold``; then it is due when the hold ends):
        True if dropped."""
        ...

    def hold(self, members: list[tuple[str, str]], in_us: int) -> None:
        """A worker holds unacked tasks it took back from each member: list it (due now
        unless listed) and keep it listed for ``in_us`` at least (a later hold may extend)."""
        ...

    def size(self) -> int:
        """How many members are listed."""
        ...


def member_of(queue: str, bucket: str) -> str:
    """One member's name in the index (a queue name holds no newline)."""
    return f"{queue}\n{bucket}"


def _split(member: str | bytes) -> tuple[str, str]:
    text = member.decode() if isinstance(member, bytes) else member
    queue, _, bucket = text.partition("\n")
    return queue, bucket


_PARK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
for i = 1, #ARGV do
  redis.call('ZADD', KEYS[1], 'NX', string.format('%d', now), ARGV[i])
  redis.call('HINCRBY', KEYS[2], ARGV[i], 1)
end
return #ARGV
"""

_DUE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now),
  'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for i = 1, #members do
  out[#out + 1] = members[i]
  out[#out + 1] = redis.call('HGET', KEYS[2], members[i]) or '0'
end
return out
"""

_DEFER = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
return redis.call('ZADD', KEYS[1], 'XX', string.format('%d', now + tonumber(ARGV[2])), ARGV[1])
"""

_DROP_IF = """
local seen = redis.call('HGET', KEYS[2], ARGV[1]) or '0'
if seen ~= ARGV[2] then
  return 0
end
local held = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if held > now then
  redis.call('ZADD', KEYS[1], 'XX', string.format('%d', held), ARGV[1])
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"""

_HOLD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local until_us = now + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'NX', string.format('%d', now), ARGV[i])
  if tonumber(redis.call('HGET', KEYS[3], ARGV[i]) or '0') < until_us then
    redis.call('HSET', KEYS[3], ARGV[i], string.format('%d', until_us))
  end
end
return #ARGV - 1
"""


class RedisOverflowIndex:
    """The index in the interval store's Redis: a sorted set of members by due time, a hash
    of their change counts and one of their holds' ends, under one hash tag (one Cluster
    slot)."""

    def __init__(self, store: Any, prefix: str) -> None:
        self._store = store
        tag = f"{keys.validate_prefix(prefix)}{{~overflow}}"
        self._keys = [f"{tag}:due", f"{tag}:changes", f"{tag}:holds"]
        self._scripts: dict[str, Any] = {}

    def _call(self, op: str, source: str, args: list[Any]) -> Any:
        with self._store.guard(f"overflow {op}"):
            client = self._store.client()
            script = self._scripts.get(op)
            if script is None:
                script = self._scripts[op] = client.register_script(source)
            return script(keys=self._keys, args=args)

    def park(self, members: list[tuple[str, str]]) -> None:
        if members:
            self._call("park", _PARK, [member_of(q, b) for q, b in members])

    def due(self, limit: int) -> list[ParkedBucket]:
        reply = self._call("due", _DUE, [max(1, limit)])
        return [
            ParkedBucket(*_split(m), int(c)) for m, c in zip(reply[::2], reply[1::2], strict=True)
        ]

    def changes(self, queue: str, bucket: str) -> int:
        with self._store.guard("overflow changes"):
            raw = self._store.client().hget(self._keys[1], member_of(queue, bucket))
        return int(raw or 0)

    def defer(self, queue: str, bucket: str, in_us: int) -> None:
        self._call("defer", _DEFER, [member_of(queue, bucket), max(0, int(in_us))])

    def drop_if(self, queue: str, bucket: str, changes: int) -> bool:
        return bool(self._call("drop_if", _DROP_IF, [member_of(queue, bucket), changes]))

    def hold(self, members: list[tuple[str, str]], in_us: int) -> None:
        if members:
            args = [max(0, int(in_us)), *(member_of(q, b) for q, b in members)]
            self._call("hold", _HOLD, args)

    def size(self) -> int:
        with self._store.guard("overflow size"):
            return int(self._store.client().zcard(self._keys[0]))


class MemoryOverflowIndex:
    """The index in one process (the memory store's tests and examples)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due_us: dict[str, int] = {}
        self._changes: dict[str, int] = {}
        self._holds_us: dict[str, int] = {}

    @staticmethod
    def _now_us() -> int:
        return time.monotonic_ns() // 1000

    def park(self, members: list[tuple[str, str]]) -> None:
        with self._lock:
            for queue, bucket in members:
                member = member_of(queue, bucket)
                self._due_us.setdefault(member, self._now_us())
                self._changes[member] = self._changes.get(member, 0) + 1

    def due(self, limit: int) -> list[ParkedBucket]:
        now_us = self._now_us()
        with self._lock:
            ready = sorted((d, m) for m, d in self._due_us.items() if d <= now_us)[: max(1, limit)]
            return [ParkedBucket(*_split(m), self._changes.get(m, 0)) for _, m in ready]

    def changes(self, queue: str, bucket: str) -> int:
        with self._lock:
            return self._changes.get(member_of(queue, bucket), 0)

    def defer(self, queue: str, bucket: str, in_us: int) -> None:
        member = member_of(queue, bucket)
        with self._lock:
            if member in self._due_us:
                self._due_us[member] = self._now_us() + max(0, in_us)

    def drop_if(self, queue: str, bucket: str, changes: int) -> bool:
        member = member_of(queue, bucket)
        with self._lock:
            if self._changes.get(member, 0) != changes:
                return False
            held_us = self._holds_us.get(member, 0)
            if held_us > self._now_us():
                if member in self._due_us:
                    self._due_us[member] = held_us
                return False
            self._due_us.pop(member, None)
            self._changes.pop(member, None)
            self._holds_us.pop(member, None)
            return True

    def hold(self, members: list[tuple[str, str]], in_us: int) -> None:
        now_us = self._now_us()
        with self._lock:
            for queue, bucket in members:
                member = member_of(queue, bucket)
                self._due_us.setdefault(member, now_us)
                self._holds_us[member] = max(self._holds_us.get(member, 0), now_us + in_us)

    def size(self) -> int:
        with self._lock:
            return len(self._due_us)


def overflow_index_for(store: Any, prefix: str) -> OverflowIndex | None:
    """The index beside ``store``: in its Redis, in its memory, or None (a file store: a worker
    then stops fetching a queue whose tasks it cannot hold, as without an overflow)."""
    from celery_interval.stores.redis import RedisStore

    if isinstance(store, RedisStore):
        return RedisOverflowIndex(store, prefix)
    owned = getattr(store, "overflow_index", None)  # the memory store keeps its own
    return owned if isinstance(owned, MemoryOverflowIndex) else None
