-- set_interval.lua: schedule.set_interval — override the interval; a longer one pushes tat.
-- KEYS[1] state hash
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] new_interval_us
-- Returns the status array of lib.lua's status_reply.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local new_interval = tonumber(ARGV[3])
local s, is_new = load_or_new(KEYS[1], now, interval)
local old = effective_interval(s, interval)
s.i = new_interval
s.t = s.t + math.max(0, new_interval - old)
save_fields(KEYS[1], s, is_new, 'i', 't')
return status_reply(s, true, now, interval)
