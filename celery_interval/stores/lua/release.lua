-- release.lua: schedule.release — the body ended: its place in the capped bucket is free.
-- KEYS[1] the bucket's places
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] the body's place name (task_id:retries)
-- Returns 1 if it held a live place, else 0; expired places are dropped.
local now = clock_us(ARGV[1])
live_places(KEYS[1], now)
return redis.call('ZREM', KEYS[1], ARGV[2])
