-- status.lua: schedule.status — read-only; an unknown bucket reads as the epoch it would get.
-- KEYS[1] state hash, KEYS[2] the bucket's places, KEYS[3] the birth marker (absent on a
-- Cluster; read, never set here)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us
-- Returns the status array of lib.lua's status_reply (exists = 0 for an unknown bucket), its
-- running = the live places.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local s, reset = load_state(KEYS[1])
local exists = s ~= nil
if s == nil then
  s = new_state(now, interval, born_us(KEYS[3], reset, now, false))
end
local running = redis.call('ZCOUNT', KEYS[2], '(' .. fmt(now), '+inf')
return status_reply(s, exists, now, interval, running)
