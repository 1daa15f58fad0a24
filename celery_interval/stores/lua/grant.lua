-- grant.lua: schedule.grant — take the next ticket and slot max(v, tat, v + not_before).
-- KEYS[1] state hash, KEYS[2] mark of (task_id, retries), KEYS[3] ledger stream
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] not_before_in_us,
-- ARGV[4] task_id, ARGV[5] retries (both for the ledger), ARGV[6] ledger_max (0 = no ledger)
-- Returns {outcome, epoch, ticket, slot_us, delay_us, paused(0|1)}; outcome 'OK' or
-- 'DUPLICATE' (the mark is a live done: ticket, slot and delay are 0). Saves a new epoch.
-- Ledger: op=grant:<outcome> now task r ticket slot delay epoch paused.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local not_before = tonumber(ARGV[3])
local task = ARGV[4]
local retries = tonumber(ARGV[5])
local ledger_max = tonumber(ARGV[6])
local s, is_new = load_or_new(KEYS[1], now, interval)
local v = virtual_now(s, now)
local paused = s.p ~= nil and 1 or 0
local m = live(load_mark(KEYS[2]), now)
local outcome, slot, delay = 'DUPLICATE', 0, 0
if m ~= nil and m.kind == 'D' then
  if is_new then
    save_state(KEYS[1], s)
  end
else
  outcome = 'OK'
  slot = math.max(v, s.t, v + math.max(0, not_before))
  delay = slot - v
  s.n = s.n + 1
  s.t = slot + effective_interval(s, interval)
  save_fields(KEYS[1], s, is_new, 't', 'n')
end
local ticket = outcome == 'OK' and s.n or 0
ledger_append(KEYS[3], ledger_max, {
  'op', 'grant:' .. outcome, 'now', now, 'task', task, 'r', retries, 'ticket', ticket,
  'slot', slot, 'delay', delay, 'epoch', s.e, 'paused', paused,
})
return { outcome, s.e, ticket, slot, delay, paused }
