-- pause.lua: schedule.pause — freeze virtual time (idempotent); an unknown bucket gets a
-- paused new epoch.
-- KEYS[1] state hash
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us
-- Returns the status array of lib.lua's status_reply.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local s, is_new = load_or_new(KEYS[1], now, interval)
if s.p == nil then
  s.p = now
  save_fields(KEYS[1], s, is_new, 'p')
end
return status_reply(s, true, now, interval)
