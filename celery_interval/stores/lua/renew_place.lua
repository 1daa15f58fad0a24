-- renew_place.lua: schedule.renew_place — extend the body's live place to now + place_us.
-- KEYS[1] the bucket's places
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] the body's place name, ARGV[3] place_us
-- Returns 1 if renewed, 0 if it holds no live place; expired places are dropped.
local now = clock_us(ARGV[1])
live_places(KEYS[1], now)
if redis.call('ZSCORE', KEYS[1], ARGV[2]) == false then
  return 0
end
put_place(KEYS[1], ARGV[2], now + tonumber(ARGV[3]), now)
return 1
