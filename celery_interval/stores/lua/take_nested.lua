-- take_nested.lua: schedule.outer.take_nested — take.lua for a nested bucket: the grant and
-- the claim in one step, each also in the outer bucket's budget (outer.lua).
-- KEYS as outer.lua's. ARGV[1..19] as take.lua's (an interactive share, ARGV[19], does not
-- apply), ARGV[20] the outer's interval_us, ARGV[21] its burst, ARGV[22] its extra limits,
-- ARGV[23] and ARGV[24] the bucket's weight and name in the outer's fair share ('': none).
-- The last ARGV, as take.lua's: the claimer (lib.lua's claimer_args; KEYS[8]: the settle
-- window's end, as KEYS[6] of take.lua). Returns take.lua's reply; grant's
-- paused is 1 also while the outer is paused (then no claim is made).
local argv = claimer_args(ARGV, KEYS[7], KEYS[8])
local now = fmt(clock_us(argv[1]))
local outer = outer_of(argv, 20)
local lease = live(load_mark(KEYS[2]), tonumber(now))
if lease ~= nil and lease.kind == 'L' and lease.holder ~= argv[7] then
  local o = load_both(KEYS, tonumber(now), tonumber(argv[2]), outer)
  return held_op(inner_keys(KEYS), argv, tonumber(now), lease, o.p ~= nil)
end
local g = nested_grant_op(KEYS, {
  now, argv[2], argv[3], argv[4], argv[5], argv[6], argv[14], argv[15], argv[16], argv[17], '',
  argv[20], argv[21], argv[22], argv[23], argv[24],
})
if g[1] ~= 'OK' or g[6] == 1 or g[5] > clamp_lead(tonumber(argv[9])) then
  return g
end
local c = nested_claim_op(KEYS, {
  now, argv[2], g[2], g[4], argv[7], argv[8], argv[9], argv[4], argv[5], g[3], argv[6], argv[10],
  argv[11], argv[12], argv[13], argv[14], argv[15], argv[18], argv[20], argv[21], argv[22],
  argv[23], argv[24],
})
return { g[1], g[2], g[3], g[4], g[5], g[6], c[1], c[2], c[3], c[4], c[5] }
