-- throttle.lua: schedule.throttle — no start of the bucket for retry_after_us; the throttled
-- copy keeps its place: a front grant of the first slot after (after the slots other throttled
-- copies keep and have not started in), which is reserved for it. The wait's end is kept (w): a
-- lease admitted before it is not started again inside it (ops.lua's claim_op).
-- KEYS[1] state hash, KEYS[2] mark of (task_id, retries), KEYS[3] ledger stream,
-- KEYS[4] the bucket's places (unused), KEYS[5] the birth marker (absent on a Cluster)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] retry_after_us,
-- ARGV[4] ticket, ARGV[5] task_id, ARGV[6] retries (both for the ledger),
-- ARGV[7] ledger_max (0 = none), ARGV[8] adapt_max_us ('' = not adaptive), ARGV[9] burst,
-- ARGV[10] cost (units; absent: 1): the burst counts as used at the last start (lib.lua's
-- emptied), ARGV[11] the bucket's extra limits (limits.lua's parse_limits; absent or '': none),
-- each emptied too
-- Returns the status array of lib.lua's status_reply.
-- Ledger: op=throttle now task r ticket retry_after slot shift epoch interval (effective, after
-- an adaptive bucket slowed), adapted (0|1).
local now = clock_us(ARGV[1])
local interval = tonumber(ARGV[2])
local retry_after = math.max(0, tonumber(ARGV[3]))
local s, is_new = load_or_new(KEYS[1], KEYS[5], now, interval)
-- the grants' times in virtual time while the throttle sets them (front.lua's ticket time)
local pushed = s.u
front_shift(s, pushed)
if ARGV[8] ~= nil and ARGV[8] ~= '' then
  slowed(s, interval, tonumber(ARGV[8]))
end
local spacing = effective_interval(s, interval)
local v = virtual_now(s, now)
local burst = tonumber(ARGV[9]) or 1
local cost = tonumber(ARGV[10]) or 1
local limits = parse_limits(ARGV[11])
local limits_first = lim_emptied(s, limits, cost, -math.huge)
local first = math.max(emptied(s, spacing, burst, cost), limits_first)
local shift = math.max(0, v + retry_after - first)
local slot = first
if s.h ~= nil then
  slot = math.max(first, s.h + spacing)
end
s.o = s.o + shift
s.t = math.max(s.t, slot + math.max(1, burst) * spacing)
s.h = slot
lim_kept(s, slot, limits)
front_shift(s, -pushed)
v = v - shift
s.w = math.max(v + retry_after, s.w or -math.huge)
save_fields(KEYS[1], s, is_new, now, interval, 'o', 't', 'h', 'a', 'k', 'q', 'z', 'x', 'w')
put_mark(KEYS[2], { kind = 'G', e = s.e, ticket = tonumber(ARGV[4]), slot = slot,
  exp = now + slot - v + GRANTED_TTL_US, front = true }, now)
ledger_append(KEYS[3], tonumber(ARGV[7]), {
  'op', 'throttle', 'now', now, 'task', ARGV[5], 'r', tonumber(ARGV[6]),
  'ticket', tonumber(ARGV[4]), 'retry_after', retry_after, 'slot', slot, 'shift', shift,
  'epoch', s.e, 'interval', spacing, 'adapted', (s.i == nil and s.a ~= nil) and 1 or 0,
})
return status_reply(s, true, now, interval)
