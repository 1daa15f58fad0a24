-- set_interval.lua: schedule.set_interval — override the interval; a longer one pushes tat.
-- KEYS[1] state hash, KEYS[2] ledger stream, KEYS[3] the bucket's places, KEYS[4] the birth
-- marker (absent on a Cluster)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] new_interval_us,
-- ARGV[4] ledger_max (0 = no ledger), ARGV[5] the bucket's burst and ARGV[6] its extra limits
-- (as status.lua's ARGV[3] and [4]; ARGV[2] stays the configured interval).
-- Returns the status array of limits.lua's paced_status_reply under the new interval, as
-- status.lua reads it: running = the live places; with ARGV[5], the next slot a ticket of
-- cost 1 gets, then the units left.
-- Ledger: op=set_interval now changed(0|1) interval (effective, i.e. the new one) paused.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local new_interval = tonumber(ARGV[3])
local s, is_new = load_or_new(KEYS[1], KEYS[4], now, interval)
local changed = (is_new or s.i ~= new_interval) and 1 or 0
respace(s, interval, new_interval)
save_fields(KEYS[1], s, is_new, now, interval, 'i', 't', 'q')
ledger_append(KEYS[2], tonumber(ARGV[4]), {
  'op', 'set_interval', 'now', now, 'changed', changed,
  'interval', effective_interval(s, interval), 'paused', s.p ~= nil and 1 or 0,
})
local running = running_places(KEYS[3], now)
return paced_status_reply(s, true, now, interval, running, ARGV[5], ARGV[6])
