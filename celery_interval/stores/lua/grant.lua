-- grant.lua: schedule.grant — take the next ticket and slot max(v, tat, v + not_before).
-- KEYS[1] state hash, KEYS[2] mark of (task_id, retries)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] not_before_in_us
-- Returns {outcome, epoch, ticket, slot_us, delay_us, paused(0|1)}; outcome 'OK' or
-- 'DUPLICATE' (the mark is a live done: ticket, slot and delay are 0). Saves a new epoch.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local not_before = tonumber(ARGV[3])
local s, is_new = load_or_new(KEYS[1], now, interval)
local v = virtual_now(s, now)
local paused = s.p ~= nil and 1 or 0
local m = live(load_mark(KEYS[2]), now)
if m ~= nil and m.kind == 'D' then
  if is_new then
    save_state(KEYS[1], s)
  end
  return { 'DUPLICATE', s.e, 0, 0, 0, paused }
end
local slot = math.max(v, s.t, v + math.max(0, not_before))
s.n = s.n + 1
s.t = slot + effective_interval(s, interval)
save_fields(KEYS[1], s, is_new, 't', 'n')
return { 'OK', s.e, s.n, slot, slot - v, paused }
