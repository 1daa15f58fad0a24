-- take.lua: schedule.take — grant, then claim in the same step when the slot is due within the
-- lead and the bucket runs: a task whose turn is now takes its ticket and start in one trip.
-- KEYS as grant.lua's. ARGV[1..6] as grant.lua's, then ARGV[7] holder, ARGV[8] lease_us,
-- ARGV[9] lead_us, ARGV[10] handoff_us, ARGV[11] cap, ARGV[12] place_us, ARGV[13] place name
-- (as claim.lua's), ARGV[14] burst, ARGV[15] cost (units; absent: 1), ARGV[16] not_after_in_us
-- ('' = none, as grant.lua's ARGV[9]), ARGV[17] the grant's extra limits (grant.lua's ARGV[10]),
-- ARGV[18] the claim's (claim.lua's ARGV[18]; absent: ARGV[17]).
-- Returns grant.lua's reply, followed by claim.lua's when it claimed (10 values); grant's
-- outcome is HELD (delay = the lease left, no ticket) while another holder's lease is live.
-- Ledger: op=grant:HELD now task r holder delay epoch interval (effective) for that.
local now = fmt(clock_us(ARGV[1]))
local lease = live(load_mark(KEYS[2]), tonumber(now))
if lease ~= nil and lease.kind == 'L' and lease.holder ~= ARGV[7] then
  local s, is_new = load_or_new(KEYS[1], KEYS[5], tonumber(now), tonumber(ARGV[2]))
  if is_new then
    save_state(KEYS[1], s, tonumber(now), tonumber(ARGV[2]))
  end
  local left = lease.exp - tonumber(now)
  ledger_append(KEYS[3], tonumber(ARGV[6]), {
    'op', 'grant:HELD', 'now', tonumber(now), 'task', ARGV[4], 'r', tonumber(ARGV[5]),
    'holder', ARGV[7], 'delay', left, 'epoch', s.e,
    'interval', effective_interval(s, tonumber(ARGV[2])),
  })
  return { 'HELD', s.e, 0, 0, left, s.p ~= nil and 1 or 0 }
end
local g = grant_op(KEYS, {
  now, ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[14], ARGV[15], ARGV[16], ARGV[17],
})
if g[1] ~= 'OK' or g[6] == 1 or g[5] > clamp_lead(tonumber(ARGV[9])) then
  return g
end
local c = claim_op(KEYS, {
  now, ARGV[2], g[2], g[4], ARGV[7], ARGV[8], ARGV[9], ARGV[4], ARGV[5], g[3], ARGV[6], ARGV[10],
  ARGV[11], ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[18] or ARGV[17],
})
return { g[1], g[2], g[3], g[4], g[5], g[6], c[1], c[2], c[3], c[4] }
