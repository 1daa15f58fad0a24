-- claim.lua: schedule.claim — may the copy held by `holder` start now?
-- KEYS[1] state hash, KEYS[2] mark of (task_id, retries)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] epoch,
-- ARGV[4] slot_us, ARGV[5] holder, ARGV[6] lease_us, ARGV[7] lead_us
-- Returns {outcome, epoch, delay_us}: OK (start_in), WAIT (wait), HELD (lease left),
-- PAUSED, DUPLICATE, RETICKET (0). Saves a new epoch; drops an expired mark; OK leases.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local epoch = tonumber(ARGV[3])
local slot = tonumber(ARGV[4])
local holder = ARGV[5]
local lease = tonumber(ARGV[6])
local lead = tonumber(ARGV[7])
local s, is_new = load_or_new(KEYS[1], now, interval)
if is_new then
  save_state(KEYS[1], s)
end
local raw = load_mark(KEYS[2])
local m = live(raw, now)
if raw ~= nil and m == nil then
  redis.call('DEL', KEYS[2])
end
if s.p ~= nil then
  return { 'PAUSED', s.e, 0 }
end
local v = virtual_now(s, now)
if m ~= nil then
  if m.kind == 'D' then
    return { 'DUPLICATE', s.e, 0 }
  end
  if m.holder ~= holder then
    return { 'HELD', s.e, m.exp - now }
  end
  return { 'OK', s.e, math.max(0, m.start - v) }
end
if epoch ~= s.e or slot < s.c then
  return { 'RETICKET', s.e, 0 }
end
local earliest = math.max(slot, s.l + effective_interval(s, interval))
if v < earliest - lead then
  return { 'WAIT', s.e, earliest - v }
end
local start = math.max(v, earliest)
s.l = start
s.c = slot
save_fields(KEYS[1], s, false, 'l', 'c')
put_mark(KEYS[2], { kind = 'L', holder = holder, start = start, exp = now + lease }, now)
return { 'OK', s.e, start - v }
