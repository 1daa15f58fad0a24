-- pause.lua: schedule.pause — freeze virtual time (idempotent); an unknown bucket gets a
-- paused new epoch.
-- KEYS[1] state hash, KEYS[2] ledger stream, KEYS[3] the bucket's places, KEYS[4] the birth
-- marker (absent on a Cluster)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] ledger_max (0 = none),
-- ARGV[4] the bucket's burst and ARGV[5] its extra limits (as status.lua's ARGV[3] and [4]).
-- Returns the status array of limits.lua's paced_status_reply after the pause, as status.lua
-- reads it: running = the live places; with ARGV[4], the next slot a ticket of cost 1 gets,
-- then the units left.
-- Ledger: op=pause now changed(0|1) interval (effective) paused.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local s, is_new = load_or_new(KEYS[1], KEYS[4], now, interval)
local changed = 0
if s.p == nil then
  s.p = now
  save_fields(KEYS[1], s, is_new, now, interval, 'p')
  changed = 1
end
ledger_append(KEYS[2], tonumber(ARGV[3]), {
  'op', 'pause', 'now', now, 'changed', changed, 'interval', effective_interval(s, interval),
  'paused', 1,
})
local running = running_places(KEYS[3], now)
return paced_status_reply(s, true, now, interval, running, ARGV[4], ARGV[5])
