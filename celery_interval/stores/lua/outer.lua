-- outer.lua: schedule.outer — a nested (inner) bucket's grants and starts also count in its
-- outer bucket's budget, kept in the outer's own state hash (its grants' tat t, its starts' l,
-- q and z, its extra limits' x). RedisStore prepends lib.lua, limits.lua, ops.lua and fair.lua
-- to the scripts that run these: grant_nested.lua, claim_nested.lua and take_nested.lua.
-- KEYS[1..4] as grant_op's, KEYS[5] the outer bucket's state hash, KEYS[6] its fair share
-- (fair.lua), KEYS[7] the birth marker and KEYS[8] the done marks' settle window's end (both
-- absent on a Cluster). On a Cluster every key must be in one hash slot: a nested bucket's
-- keys carry its outer bucket's hash tag (stores/keys.py).
-- The outer's arguments follow the inner op's: its interval_us, burst and extra limits
-- (limits.lua's parse_limits), then the inner bucket's weight in the outer's fair share and
-- its name there ('' and '': no fair share).

local function outer_of(argv, at)
  return { t = tonumber(argv[at]), b = tonumber(argv[at + 1]) or 1,
    limits = parse_limits(argv[at + 2]), w = num(argv[at + 3]), key = argv[at + 4] }
end

-- The inner op's KEYS: the inner bucket's four, then the birth marker if any.
local function inner_keys(keys)
  return { keys[1], keys[2], keys[3], keys[4], keys[7], keys[8] }
end

-- schedule.outer._slot: the outer budget's earliest slot of cost at its virtual v.
local function outer_slot(o, v, outer, cost)
  local spacing = effective_interval(o, outer.t)
  local slot = math.max(v, grant_tat(o, spacing, outer.b) - room(outer.b, cost) * spacing)
  return lim_next_slot(o, outer.limits, cost, slot)
end

-- schedule.outer._reserved: a ticket of cost at the outer's slot; none when the slot is more
-- than one interval past the budget's next free time. Returns whether it reserved.
local function outer_reserve(o, slot, v, outer, cost)
  local spacing = effective_interval(o, outer.t)
  local tat = grant_tat(o, spacing, outer.b)
  if slot > math.max(tat, v) + spacing then
    return false
  end
  lim_after_grant(o, slot, outer.limits, cost)
  o.t = math.max(tat, slot) + math.max(1, cost) * spacing
  return true
end

-- schedule.outer.outer_earliest: the outer's earliest virtual time for a start of cost.
local function outer_earliest(o, outer, cost)
  local spacing = effective_interval(o, outer.t)
  return lim_earliest_start(o, outer.limits, cost, earliest_start(o, spacing, outer.b, cost))
end

-- schedule.outer._started: the outer's record after a start of cost at its virtual start.
local function outer_started(o, start, outer, cost)
  local spacing = effective_interval(o, outer.t)
  lim_after_start(o, start, outer.limits, cost)
  after_start(o, start, spacing, outer.b, cost)
end

-- Both records (a missing one as its new epoch: the outer's saved at once) and the outer's
-- virtual time minus the inner's.
local function load_both(keys, now, interval, outer)
  local o, o_new = load_or_new(keys[5], keys[7], now, outer.t)
  if o_new then
    save_state(keys[5], o, now, outer.t)
  end
  local s, is_new = load_or_new(keys[1], keys[7], now, interval)
  return o, s, is_new, virtual_now(o, now) - virtual_now(s, now)
end

-- schedule.outer.grant_nested: grant_op (ARGV[1..10]; ARGV[11], an interactive share, does
-- not apply) at the outer's next slot at the earliest; a new ticket reserves its slot in both
-- (under a fair share: none, the slot no sooner than the outer's start budget allows).
-- ARGV[12..16] the outer's. Returns grant_op's reply, paused (1) also while the outer is paused.
local function nested_grant_op(keys, argv)
  local now = clock_us(argv[1])
  local cost = tonumber(argv[8]) or 1
  local outer = outer_of(argv, 12)
  local o, s, _, shift = load_both(keys, now, tonumber(argv[2]), outer)
  local v = virtual_now(s, now)
  local floor
  if outer.w ~= nil then
    floor = outer_earliest(o, outer, cost) - shift
  else
    floor = outer_slot(o, v + shift, outer, cost) - shift
  end
  local g = grant_op(inner_keys(keys), {
    fmt(now), argv[2], fmt(math.max(tonumber(argv[3]), floor - v)), argv[4], argv[5], argv[6],
    argv[7], argv[8], argv[9], argv[10],
  })
  if outer.w == nil and g[1] == 'OK' and g[3] > s.n
      and outer_reserve(o, g[4] + shift, v + shift, outer, cost) then
    save_fields(keys[5], o, false, now, outer.t, 't', 'x')
  end
  if o.p ~= nil then
    g[6] = 1
  end
  return g
end

-- The gate of claim_op (ops.lua) for a key of the outer's fair share (schedule.fair_claim.
-- claim_fair): its turn, and its start, in the share at keys[6], o the outer's record.
local function fair_gate(keys, o, outer, cost, now, lead)
  local spacing = effective_interval(o, outer.t)
  local free_in = outer_earliest(o, outer, cost) - virtual_now(o, now)
  local f = fair_load(keys[6])
  return {
    turn = function()
      local wait = fair_turn(f, outer.key, outer.w, now, spacing, free_in, clamp_lead(lead))
      fair_save(keys[6], f)
      return wait
    end,
    started = function(delay, own)
      fair_started(f, outer.key, outer.w, cost, spacing, now, now + delay + own)
      fair_save(keys[6], f)
    end,
  }
end

-- schedule.outer.claim_nested: claim_op (ARGV[1..18]) no sooner than the outer's budget
-- allows; a new start is counted in both. ARGV[19..23] the outer's (under a fair share,
-- schedule.fair_claim.claim_fair: claim_op's gate is the key's turn). PAUSED while the outer
-- is paused (the inner's new epoch saved, an expired mark dropped).
-- Ledger: claim_op's entries; op=claim:PAUSED now task r ticket slot holder epoch outer=1
-- (and missed=1, as claim_op's) for a claim refused by the outer's pause.
local function nested_claim_op(keys, argv)
  local now = clock_us(argv[1])
  local interval = tonumber(argv[2])
  local cost = tonumber(argv[17]) or 1
  local outer = outer_of(argv, 19)
  local o, s, is_new, shift = load_both(keys, now, interval, outer)
  if o.p ~= nil then
    if is_new then
      save_state(keys[1], s, now, interval)
    end
    local raw = load_mark(keys[2])
    local m = live(raw, now)
    if raw ~= nil and m == nil then
      redis.call('DEL', keys[2])
    end
    local fields = {
      'op', 'claim:PAUSED', 'now', now, 'task', argv[8], 'r', tonumber(argv[9]),
      'ticket', tonumber(argv[10]), 'slot', tonumber(argv[4]), 'holder', argv[5], 'epoch', s.e,
      'outer', 1,
    }
    if own_lease(m, argv[5]) then
      fields[#fields + 1] = 'missed'
      fields[#fields + 1] = 1
    end
    ledger_append(keys[3], tonumber(argv[11]), fields)
    return { 'PAUSED', s.e, 0, now }
  end
  local v = virtual_now(s, now)
  local spacing = effective_interval(o, outer.t)
  local before = redis.call('GET', keys[2])
  local m = before and live(parse_mark(before), now) or nil
  -- schedule.outer.moves_in_outer: the holder's lease whose start the outer is as it left
  local moves = m ~= nil and m.kind == 'L' and m.holder == argv[5] and m.otat ~= nil
    and m.otat == start_tat(o, spacing, outer.b)
  local floor
  if moves then
    floor = lim_earliest_start(o, outer.limits, cost, o.l) - shift
  else
    floor = outer_earliest(o, outer, cost) - shift
  end
  local args = { fmt(now) }
  for i = 2, 18 do
    args[i] = argv[i]
  end
  args[19] = fmt(floor)
  args[20] = fmt(spacing)
  local gate = nil
  if outer.w ~= nil and not moves then  -- a readmit that moves is charged no second start
    gate = fair_gate(keys, o, outer, cost, now, tonumber(argv[7]))
  end
  local c = claim_op(inner_keys(keys), args, gate)
  if c[1] == 'OK' and redis.call('GET', keys[2]) ~= before then
    local start = v + c[3] + shift
    if moves then
      lim_after_start(o, start, outer.limits, cost)
      moved(o, start, spacing, outer.b, cost)
    else
      outer_started(o, start, outer, cost)
    end
    save_fields(keys[5], o, false, now, outer.t, 'l', 'q', 'z', 'x')
    local lease = load_mark(keys[2])
    lease.otat = start_tat(o, spacing, outer.b)
    put_mark(keys[2], lease, now)
  end
  return c
end
