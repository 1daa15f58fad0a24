-- status.lua: schedule.status — read-only; an unknown bucket reads as the epoch it would get.
-- KEYS[1] state hash, KEYS[2] the bucket's places, KEYS[3] the birth marker (absent on a
-- Cluster; read, never set here)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] the bucket's burst
-- and ARGV[4] its extra limits (as grant.lua's ARGV[10]); without ARGV[3] the next slot is
-- where every grants' budget is full again and no units follow.
-- Returns the status array of limits.lua's paced_status_reply (exists = 0 for an unknown
-- bucket), its running = the live places; with ARGV[3], next slot = the slot a ticket of cost 1
-- gets now, followed by the units left of the interval's budget and of each extra limit's.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local s, reset = load_state(KEYS[1])
local exists = s ~= nil
if s == nil then
  s = new_state(now, interval, born_us(KEYS[3], reset, now, false))
end
local running = running_places(KEYS[2], now)
return paced_status_reply(s, exists, now, interval, running, ARGV[3], ARGV[4])
