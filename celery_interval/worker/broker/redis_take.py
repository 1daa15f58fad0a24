"""Taking a parked copy back from a Redis broker in one step: off its queue, into unacked."""

from __future__ import annotations

import time
from typing import Any

from kombu import serialization
from kombu.transport import virtual
from kombu.utils import encoding, json

__all__ = ["is_redis_channel", "take_back"]

# Untyped in kombu:
_QoS: Any = virtual.QoS
_prepare_accept_content: Any = serialization.prepare_accept_content
_bytes_to_str: Any = encoding.bytes_to_str
_loads: Any = json.loads

#: kombu's ``basic_get`` on Redis pops the message, renews the queue's expiry and writes its
#: unacked record in three round trips: a connection lost between the first and the last loses
#: the message (in no queue, in no unacked record). This does the same in one script.
#: KEYS: the queue's priority lists in kombu's order, then its unacked index and unacked hash.
#: ARGV[1] the score of the unacked index (the worker's time.time(), as kombu's), ARGV[2] the
#: queue's x-expires in ms ('' = none). Returns the message as kombu stored it, or nil.
_TAKE_BACK = """
local lists = #KEYS - 2
local function renew()
  if ARGV[2] ~= '' then
    for i = 1, lists do
      redis.call('PEXPIRE', KEYS[i], ARGV[2])
    end
  end
end
for i = 1, lists do
  local item = redis.call('RPOP', KEYS[i])
  if item then
    local properties = cjson.decode(item)['properties']
    local tag = properties['delivery_tag']
    local info = properties['delivery_info'] or {}
    redis.call('ZADD', KEYS[lists + 1], ARGV[1], tag)
    redis.call('HSET', KEYS[lists + 2], tag, '[' .. item .. ',' ..
      cjson.encode(info['exchange'] or '') .. ',' .. cjson.encode(info['routing_key'] or '') .. ']')
    renew()
    return item
  end
end
renew()
return false
"""


def is_redis_channel(channel: Any) -> bool:
    """Whether ``channel`` is kombu's Redis (or Sentinel) transport's (a virtual channel's
    ``connection`` is its transport; an AMQP channel's is its connection)."""
    return getattr(channel.connection, "driver_type", "") == "redis"


def take_back(channel: Any, name: str, accept: Any) -> Any:
    """The head message of queue ``name`` on a Redis ``channel``, unacknowledged (its unacked
    record written in the same script that took it off the queue), or None if it is empty;
    as ``kombu.Queue.get(no_ack=False, accept=accept)`` returns it."""
    prefix = channel.global_keyprefix
    keys = [prefix + channel._q_for_pri(name, pri) for pri in channel.priority_steps]
    keys += [prefix + channel.unacked_index_key, prefix + channel.unacked_key]
    expires = channel._expires.get(name) if channel._expires else None
    with channel.conn_or_acquire() as client:
        # EVAL: kombu's prefixing client leaves its keys as they are (EVALSHA's it would not).
        item = client.eval(_TAKE_BACK, len(keys), *keys, time.time(), expires or "")
    if item is None:
        return None
    raw = channel.Message(_loads(_bytes_to_str(item)), channel=channel)
    _QoS.append(channel.qos, raw, raw.delivery_tag)  # the script wrote the record
    message = channel.message_to_python(raw)
    if message.errors:
        message._reraise_error()
    message.accept = _prepare_accept_content(accept)
    return message
