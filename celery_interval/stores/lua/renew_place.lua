-- renew_place.lua: schedule.renew_place — extend the body's live place to now + place_us, or
-- take it again (the store lost it, or it expired) while fewer than cap places are live.
-- KEYS[1] the bucket's places
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] the body's place name, ARGV[3] place_us,
-- ARGV[4] cap ('' = none: no place is taken again)
-- Returns 1 if renewed or taken again, 0 if it holds none and cannot; expired places are
-- dropped.
local now = clock_us(ARGV[1])
local places = live_places(KEYS[1], now)
if redis.call('ZSCORE', KEYS[1], ARGV[2]) == false then
  local cap = num(ARGV[4])
  if cap == nil or #places / 2 >= cap then
    return 0
  end
end
put_place(KEYS[1], ARGV[2], now + tonumber(ARGV[3]), now)
return 1
