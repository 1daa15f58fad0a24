"""A Redis broker's one unrecorded message: what a worker popped as it was killed.

kombu's Redis transport takes a message off its queue with ``BRPOP`` and only then records it
as unacknowledged (``ZADD unacked_index`` + ``HSET unacked``, celery/celery#7950). While a
queue has messages a consuming worker nearly always has one such pop in flight, so a worker
SIGKILLed then takes that one message with it: no worker ever receives it and no
``restore_visible`` can give it back; a broker that dies with the pop's reply on its way loses
it the same way. The guarantees page lists this upstream limit. The tests excuse exactly that:
a missing task no worker's log ever received, on a Redis broker, at most one per killed worker
(and, in the soak, one per worker per broker death).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

#: Celery's received line: ``Task name[id] received``.
_RECEIVED = re.compile(r"\[([0-9a-f-]{36})\] received")


def received_list(log: str) -> list[str]:
    """The task ids one worker log says it received, once per delivery."""
    return [match.group(1) for match in _RECEIVED.finditer(log)]


#: The DEBUG trail of held messages going back to the broker as a connection is lost.
_RETURNED = re.compile(r"interval: connection lost, (?:held|taken back) \d+: ([0-9a-f -]+)")


def held_at_the_end(logs: Mapping[str, str], killed: Collection[str] = ()) -> set[str]:
    """Task ids some worker's log (by worker name) last says it received, not that their
    messages went back to the broker with a lost connection (the DEBUG trail), on a worker
    not ``killed``: a killed worker's unacknowledged messages go back after the visibility
    timeout. A message that went back may be popped by a worker killed as it took it again,
    which no log then shows."""
    held: set[str] = set()
    for name, log in logs.items():
        if name in killed:
            continue
        mine: set[str] = set()
        for line in log.splitlines():
            if (received := _RECEIVED.search(line)) is not None:
                mine.add(received.group(1))
            elif (returned := _RETURNED.search(line)) is not None:
                mine.difference_update(returned.group(1).split())
        held |= mine
    return held


def received_ids(logs: Iterable[str]) -> set[str]:
    """Every task id a worker log says it received."""
    return {task_id for log in logs for task_id in received_list(log)}


def popped_as_killed(missing: Iterable[str], logs: Iterable[str], broker_url: str) -> set[str]:
    """The ``missing`` task ids no worker ever received, on a Redis broker (none elsewhere:
    an AMQP broker keeps a delivery until it is acknowledged)."""
    if not broker_url.startswith(("redis", "rediss", "sentinel")):
        return set()
    return set(missing) - received_ids(logs)
