-- unpause.lua: schedule.unpause — the pause's length joins the offset (idempotent);
-- an unknown bucket gets a new epoch.
-- KEYS[1] state hash
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us
-- Returns the status array of lib.lua's status_reply.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local s, is_new = load_or_new(KEYS[1], now, interval)
if is_new then
  save_state(KEYS[1], s)
elseif s.p ~= nil then
  s.o = s.o + now - s.p
  s.p = nil
  save_fields(KEYS[1], s, false, 'o', 'p')
end
return status_reply(s, true, now, interval)
