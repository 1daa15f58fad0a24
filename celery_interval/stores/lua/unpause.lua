-- unpause.lua: schedule.unpause — the pause's length joins the offset (idempotent);
-- an unknown bucket gets a new epoch.
-- KEYS[1] state hash, KEYS[2] ledger stream, KEYS[3] the bucket's places, KEYS[4] the birth
-- marker (absent on a Cluster)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] ledger_max (0 = none),
-- ARGV[4] the bucket's burst and ARGV[5] its extra limits (as status.lua's ARGV[3] and [4]).
-- Returns the status array of limits.lua's paced_status_reply after the unpause, as status.lua
-- reads it: running = the live places; with ARGV[4], the next slot a ticket of cost 1 gets,
-- then the units left.
-- Ledger: op=unpause now changed(0|1) interval (effective) paused.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local s, is_new = load_or_new(KEYS[1], KEYS[4], now, interval)
local changed = 0
if is_new then
  save_state(KEYS[1], s, now, interval)
  changed = 1
elseif s.p ~= nil then
  s.o = s.o + now - s.p
  s.p = nil
  save_fields(KEYS[1], s, false, now, interval, 'o', 'p')
  changed = 1
end
ledger_append(KEYS[2], tonumber(ARGV[3]), {
  'op', 'unpause', 'now', now, 'changed', changed, 'interval', effective_interval(s, interval),
  'paused', s.p ~= nil and 1 or 0,
})
local running = running_places(KEYS[3], now)
return paced_status_reply(s, true, now, interval, running, ARGV[4], ARGV[5])
