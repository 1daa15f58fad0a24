-- unset_interval.lua: schedule.unset_interval — drop the override (the configured interval is
-- back; a longer one pushes tat); a bucket with no override, or no state, is left as it is.
-- KEYS[1] state hash, KEYS[2] ledger stream, KEYS[3] the bucket's places, KEYS[4] the birth
-- marker (absent on a Cluster; read, never set here)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] ledger_max (0 = none),
-- ARGV[4] the bucket's burst and ARGV[5] its extra limits (as status.lua's ARGV[3] and [4]).
-- Returns the status array of limits.lua's paced_status_reply after the change, as status.lua
-- reads it (running = the live places; with ARGV[4], the next slot a ticket of cost 1 gets,
-- then the units left), then dropped (0|1).
-- Ledger: op=unset_interval now changed(0|1) interval (effective, i.e. the configured) paused.
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local s, reset = load_state(KEYS[1])
local exists = s ~= nil
local dropped = 0
if s == nil then
  s = new_state(now, interval, born_us(KEYS[4], reset, now, false))
elseif s.i ~= nil then
  respace(s, interval, nil)
  save_fields(KEYS[1], s, false, now, interval, 'i', 't', 'q')
  dropped = 1
end
ledger_append(KEYS[2], tonumber(ARGV[3]), {
  'op', 'unset_interval', 'now', now, 'changed', dropped,
  'interval', effective_interval(s, interval), 'paused', s.p ~= nil and 1 or 0,
})
local running = running_places(KEYS[3], now)
local reply = paced_status_reply(s, exists, now, interval, running, ARGV[4], ARGV[5])
reply[#reply + 1] = dropped
return reply
