-- take_nested.lua: schedule.outer.take_nested — take.lua for a nested bucket: the grant and
-- the claim in one step, each also in the outer bucket's budget (outer.lua).
-- KEYS as outer.lua's. ARGV[1..19] as take.lua's (an interactive share, ARGV[19], does not
-- apply), ARGV[20] the outer's interval_us, ARGV[21] its burst, ARGV[22] its extra limits.
-- Returns take.lua's reply; grant's paused is 1 also while the outer is paused (then no claim
-- is made).
local now = fmt(clock_us(ARGV[1]))
local outer = outer_of(ARGV, 20)
local lease = live(load_mark(KEYS[2]), tonumber(now))
if lease ~= nil and lease.kind == 'L' and lease.holder ~= ARGV[7] then
  local o = load_both(KEYS, tonumber(now), tonumber(ARGV[2]), outer)
  return held_op(inner_keys(KEYS), ARGV, tonumber(now), lease, o.p ~= nil)
end
local g = nested_grant_op(KEYS, {
  now, ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[14], ARGV[15], ARGV[16], ARGV[17], '',
  ARGV[20], ARGV[21], ARGV[22],
})
if g[1] ~= 'OK' or g[6] == 1 or g[5] > clamp_lead(tonumber(ARGV[9])) then
  return g
end
local c = nested_claim_op(KEYS, {
  now, ARGV[2], g[2], g[4], ARGV[7], ARGV[8], ARGV[9], ARGV[4], ARGV[5], g[3], ARGV[6], ARGV[10],
  ARGV[11], ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[18], ARGV[20], ARGV[21], ARGV[22],
})
return { g[1], g[2], g[3], g[4], g[5], g[6], c[1], c[2], c[3], c[4] }
