-- claim.lua: schedule.claim — may the copy held by `holder` start now?
-- KEYS[1] state hash, KEYS[2] mark of (task_id, retries), KEYS[3] ledger stream
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] epoch,
-- ARGV[4] slot_us, ARGV[5] holder, ARGV[6] lease_us, ARGV[7] lead_us (clamped to
-- 0..MAX_LEAD_US), ARGV[8] task_id, ARGV[9] retries, ARGV[10] ticket (these three for the
-- ledger only), ARGV[11] ledger_max (0 = no ledger), ARGV[12] handoff_us (clamped to 0..lead)
-- Returns {outcome, epoch, delay_us, now_us}: OK (start_in), WAIT (wait), HELD (lease left),
-- PAUSED, DUPLICATE, RETICKET (0). Saves a new epoch; drops an expired mark; OK leases.
-- Ledger: op=claim:<outcome> now task r ticket slot holder epoch, plus for OK start (real µs)
-- and late (virtual start - slot, >= 0; again=1 when the holder re-claims its own lease),
-- for WAIT and HELD delay.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local epoch = tonumber(ARGV[3])
local slot = tonumber(ARGV[4])
local holder = ARGV[5]
local lease = tonumber(ARGV[6])
local lead = tonumber(ARGV[7])
local ledger_max = tonumber(ARGV[11])
local handoff = tonumber(ARGV[12])

local function reply(s, outcome, delay, ...)
  local fields = {
    'op', 'claim:' .. outcome, 'now', now, 'task', ARGV[8], 'r', tonumber(ARGV[9]),
    'ticket', tonumber(ARGV[10]), 'slot', slot, 'holder', holder, 'epoch', s.e,
  }
  for _, x in ipairs({ ... }) do
    fields[#fields + 1] = x
  end
  ledger_append(KEYS[3], ledger_max, fields)
  return { outcome, s.e, delay, now }
end

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
  return reply(s, 'PAUSED', 0)
end
local v = virtual_now(s, now)
if m ~= nil then
  if m.kind == 'D' then
    return reply(s, 'DUPLICATE', 0)
  end
  if m.holder ~= holder then
    local left = m.exp - now
    return reply(s, 'HELD', left, 'delay', left)
  end
  local start_in = math.max(0, m.start - v)
  return reply(s, 'OK', start_in, 'start', now + start_in,
    'late', math.max(0, v + start_in - slot), 'again', 1)
end
if epoch ~= s.e or slot < s.c then
  return reply(s, 'RETICKET', 0)
end
local earliest = math.max(slot, s.l + effective_interval(s, interval))
lead = math.min(math.max(0, lead), MAX_LEAD_US)
if v + lead < earliest then
  return reply(s, 'WAIT', earliest - v, 'delay', earliest - v)
end
local start = math.max(v + math.min(math.max(0, handoff), lead), earliest)
s.l = start
s.c = slot
save_fields(KEYS[1], s, false, 'l', 'c')
put_mark(KEYS[2], { kind = 'L', holder = holder, start = start, exp = now + lease }, now)
return reply(s, 'OK', start - v, 'start', now + start - v, 'late', start - slot)
