-- done.lua: schedule.done — the messages were acknowledged; later copies are duplicates.
-- KEYS[1..n] marks of (task_id, retries), all of ONE bucket (one hash slot on a Cluster)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] dedupe_ttl_us
-- Returns n. Replaces each mark (any lease) with "D|<now + dedupe_ttl_us>".
local now = clock_us(ARGV[1])
local ttl = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  put_mark(key, { kind = 'D', exp = now + ttl }, now)
end
return #KEYS
