-- take.lua: schedule.take — grant, then claim in the same step when the slot is due within the
-- lead and the bucket runs: a task whose turn is now takes its ticket and start in one trip.
-- KEYS as grant.lua. ARGV[1..6] as grant.lua's, then ARGV[7] holder, ARGV[8] lease_us,
-- ARGV[9] lead_us, ARGV[10] handoff_us (as claim.lua's).
-- Returns grant.lua's reply, followed by claim.lua's when it claimed (10 values).
local now = fmt(clock_us(ARGV[1]))
local g = grant_op(KEYS, { now, ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6] })
if g[1] ~= 'OK' or g[6] == 1 or g[5] > clamp_lead(tonumber(ARGV[9])) then
  return g
end
local c = claim_op(KEYS, {
  now, ARGV[2], g[2], g[4], ARGV[7], ARGV[8], ARGV[9], ARGV[4], ARGV[5], g[3], ARGV[6], ARGV[10],
})
return { g[1], g[2], g[3], g[4], g[5], g[6], c[1], c[2], c[3], c[4] }
