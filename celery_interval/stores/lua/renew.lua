-- renew.lua: schedule.renew — extend holder's live lease to now + lease_us.
-- KEYS[1] mark of (task_id, retries)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] holder, ARGV[3] lease_us
-- Returns 1 if renewed, 0 if holder has no live lease (an expired mark is dropped).
local now = clock_us(ARGV[1])
local holder = ARGV[2]
local lease = tonumber(ARGV[3])
local raw = load_mark(KEYS[1])
local m = live(raw, now)
if m ~= nil and m.kind == 'L' and m.holder == holder then
  m.exp = now + lease
  put_mark(KEYS[1], m, now)
  return 1
end
if raw ~= nil and m == nil then
  drop_mark(KEYS[1])
end
return 0
