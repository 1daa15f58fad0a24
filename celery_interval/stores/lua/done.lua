-- done.lua: schedule.done — the messages were acknowledged; later copies are duplicates.
-- KEYS[1..n] marks of (task_id, retries), all of ONE bucket (one hash slot on a Cluster)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] dedupe_ttl_us
-- Returns n. Replaces each mark (any lease) with "D|<now + dedupe_ttl_us>", except a live
-- front grant (schedule.done_mark: the ack of the run that was throttled).
local now = clock_us(ARGV[1])
local ttl = tonumber(ARGV[2])
for _, key in ipairs(KEYS) do
  local m = live(load_mark(key), now)
  if m == nil or m.kind ~= 'G' or not m.front then
    put_mark(key, { kind = 'D', exp = now + ttl }, now)
  end
end
return #KEYS
