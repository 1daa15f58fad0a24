-- ops.lua: the grant and claim operations as functions of (keys, argv) laid out as grant.lua's
-- and claim.lua's KEYS and ARGV; RedisStore prepends this file (after lib.lua) to the scripts
-- that run them: grant.lua, claim.lua, take.lua (both in one step) and take_many.lua.

-- grant_op: schedule.grant — the next ticket and slot (lib.lua's next_slot; with no burst
-- max(v, tat)), or v + not_before if later; or the same ticket and slot again for a copy whose
-- granted slot no later start has passed.
-- KEYS[1] state hash, KEYS[2] mark of (task_id, retries), KEYS[3] ledger stream,
-- KEYS[4] the bucket's places (claim_op only), KEYS[5] the birth marker (absent on a Cluster:
-- lib.lua's born_us)
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] not_before_in_us,
-- ARGV[4] task_id, ARGV[5] retries (both for the ledger), ARGV[6] ledger_max (0 = no ledger),
-- ARGV[7] burst, ARGV[8] cost (units; absent: 1), ARGV[9] not_after_in_us (absent or '': none),
-- ARGV[10] the bucket's extra limits (limits.lua's parse_limits; absent or '': none),
-- ARGV[11] an interactive start's share (front.lua; absent or '': none)
-- A ticket's slot is in ticket time (lib.lua's u): its delay is slot + u - v. An interactive
-- start ahead of the tickets gets a front grant of its slot (virtual time, reserved: h), or WAIT
-- (no ticket) until its share's GCRA conforms.
-- Returns {outcome, epoch, ticket, slot_us, delay_us, paused(0|1)}; outcome 'OK',
-- 'DUPLICATE' (the mark is a live done: ticket, slot and delay are 0) or 'WAIT' (a new slot
-- would be further than not_after from now: no ticket taken, nothing changed but a new epoch
-- saved and an expired mark dropped; slot and delay are that slot's). Saves a new epoch;
-- a new ticket leaves a granted mark (unless the copy's task holds a live lease).
-- Ledger: op=grant:<outcome> now task r ticket slot delay epoch paused interval (effective),
-- again=1 when a copy got its slot again, front=1 for an interactive start ahead of the tickets.
local function grant_op(keys, argv)
  local now = clock_us(argv[1])
  local interval = tonumber(argv[2])
  local not_before = tonumber(argv[3])
  local task = argv[4]
  local retries = tonumber(argv[5])
  local ledger_max = tonumber(argv[6])
  local burst = tonumber(argv[7]) or 1
  local cost = tonumber(argv[8]) or 1
  local not_after = num(argv[9])
  local limits = parse_limits(argv[10])
  local share = num(argv[11])
  local s, is_new = load_or_new(keys[1], keys[5], now, interval)
  local v = virtual_now(s, now)
  local paused = s.p ~= nil and 1 or 0
  local raw = load_mark(keys[2])
  local m = live(raw, now)
  local outcome, ticket, slot, delay, again = 'DUPLICATE', 0, 0, 0, nil
  local ahead, waits = false, false
  local spacing = effective_interval(s, interval)
  local reuse = m ~= nil and m.kind == 'G' and m.e == s.e and (m.front or m.slot >= s.c)
  if (m ~= nil and m.kind == 'D') or reuse then
    if is_new then
      save_state(keys[1], s, now, interval)
    end
    if reuse then
      outcome, ticket, slot, again = 'OK', m.ticket, m.slot, 1
      delay = math.max(0, slot + (m.front and 0 or s.u) - v)
    end
  else
    outcome = 'OK'
    front_rebased(s) -- saved only with a new ticket (a WAIT leaves the state as it was)
    front_shift(s, s.u) -- the grants' times in virtual time
    slot = math.max(next_slot(s, v, spacing, burst, cost), v + math.max(0, not_before))
    slot = lim_next_slot(s, limits, cost, slot)
    front_shift(s, -s.u)
    local at
    at, ahead, waits = front_ahead(s, v, spacing, share, not_before, burst, cost, limits, slot)
    slot = ahead and at or slot - s.u
    delay = at - v
  end
  if outcome == 'OK' and not again and (waits or (not_after ~= nil and delay > not_after)) then
    outcome = 'WAIT'
    if is_new then
      save_state(keys[1], s, now, interval)
    end
    if raw ~= nil and m == nil then
      drop_mark(keys[2])
    end
  elseif outcome == 'OK' and not again then
    s.n = s.n + 1
    if ahead then
      front_after(s, slot, spacing, share, burst, cost, limits)
      save_fields(keys[1], s, is_new, now, interval, 't', 'n', 'g', 'c', 'h', 'f', 'u', 'x')
    else
      front_shift(s, s.u)
      lim_after_grant(s, slot + s.u, limits, cost)
      after_grant(s, slot + s.u, spacing, burst, cost)
      front_shift(s, -s.u)
      save_fields(keys[1], s, is_new, now, interval, 't', 'n', 'g', 'c', 'u', 'x')
    end
    ticket = s.n
    if m == nil or m.kind ~= 'L' then
      put_mark(keys[2], { kind = 'G', e = s.e, ticket = ticket, slot = slot,
        exp = now + delay + GRANTED_TTL_US, front = ahead }, now)
    end
  end
  local fields = {
    'op', 'grant:' .. outcome, 'now', now, 'task', task, 'r', retries, 'ticket', ticket,
    'slot', slot, 'delay', delay, 'epoch', s.e, 'paused', paused,
    'interval', effective_interval(s, interval),
  }
  if again then
    fields[#fields + 1] = 'again'
    fields[#fields + 1] = 1
  end
  if ahead and outcome == 'OK' then
    fields[#fields + 1] = 'front'
    fields[#fields + 1] = 1
  end
  ledger_append(keys[3], ledger_max, fields)
  return { outcome, s.e, ticket, slot, delay, paused }
end

-- claim_op: schedule.claim — may the copy held by `holder` start now?
-- KEYS as grant_op's
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] epoch,
-- ARGV[4] slot_us, ARGV[5] holder, ARGV[6] lease_us, ARGV[7] lead_us (clamped to
-- 0..MAX_LEAD_US), ARGV[8] task_id, ARGV[9] retries, ARGV[10] ticket (these three for the
-- ledger only), ARGV[11] ledger_max (0 = no ledger), ARGV[12] handoff_us (clamped to
-- 0..min(lead, interval)), ARGV[13] cap ('' = none), ARGV[14] place_us, ARGV[15] the body's
-- place name (task_id:retries), ARGV[16] burst, ARGV[17] cost (units; absent: 1), ARGV[18]
-- the bucket's extra limits (as grant_op's ARGV[10]), ARGV[19] no start before this virtual
-- time of the bucket (absent or '': none; an outer bucket's budget, outer.lua)
-- Under a cap (schedule.claim_capped), a claim that would start takes (or renews) its place;
-- when the live places are all others' it is FULL (delay: until the first expires, at most
-- PLACE_POLL_US) and changes nothing else; expired places are dropped then. Until
-- PLACE_SETTLE_US after the store's birth marker (KEYS[5]; none on a Cluster) a claim holding no
-- place is FULL (delay: until then): running bodies take back the places a lost store forgot.
-- Returns {outcome, epoch, delay_us, now_us}: OK (start_in), WAIT (wait), FULL (wait), HELD
-- (lease left), PAUSED, DUPLICATE, RETICKET (0). A throttled task's front grant keeps its
-- slot after later starts (no RETICKET) and, the last one kept, frees the reserved slot (h); so
-- does an interactive start's (front.lua); a ticket starts at its slot + u at the earliest;
-- every other claim starts an interval after the reserved slot at the earliest; none starts before
-- the latest throttle's wait ends (w). Saves a new epoch; drops an
-- expired mark; OK leases (a granted mark is no lease: it only gives a redelivered copy the
-- same slot).
-- Ledger: op=claim:<outcome> now task r ticket slot holder epoch interval (effective), plus
-- for OK start (real µs) and late (virtual start - slot, a ticket's slot pushed by u, >= 0;
-- again=1 when the holder re-claims its own lease before its start; readmit=1 when its admitted
-- start passed unheard and a new start was admitted, moved=1 too when that start replaces the
-- missed one, the bucket's last start), for WAIT, FULL and HELD delay; burst and cost on
-- every claim of a bucket with a burst or a task with a cost (absent: 1); limits (as ARGV[18])
-- on every claim of a bucket with extra limits.
local function claim_op(keys, argv)
  local now = clock_us(argv[1])
  local interval = tonumber(argv[2])
  local epoch = tonumber(argv[3])
  local slot = tonumber(argv[4])
  local holder = argv[5]
  local lease = tonumber(argv[6])
  local lead = tonumber(argv[7])
  local ledger_max = tonumber(argv[11])
  local handoff = tonumber(argv[12])
  local cap = num(argv[13])
  local place_us = tonumber(argv[14])
  local place = argv[15]
  local burst = tonumber(argv[16]) or 1
  local cost = tonumber(argv[17]) or 1
  local limits = parse_limits(argv[18])
  local not_before = num(argv[19])

  local function reply(s, outcome, delay, ...)
    local fields = {
      'op', 'claim:' .. outcome, 'now', now, 'task', argv[8], 'r', tonumber(argv[9]),
      'ticket', tonumber(argv[10]), 'slot', slot, 'holder', holder, 'epoch', s.e,
      'interval', effective_interval(s, interval),
    }
    if burst ~= 1 or cost ~= 1 then
      fields[#fields + 1] = 'burst'
      fields[#fields + 1] = burst
      fields[#fields + 1] = 'cost'
      fields[#fields + 1] = cost
    end
    if #limits > 0 then
      fields[#fields + 1] = 'limits'
      fields[#fields + 1] = argv[18]
    end
    for _, x in ipairs({ ... }) do
      fields[#fields + 1] = x
    end
    ledger_append(keys[3], ledger_max, fields)
    return { outcome, s.e, delay, now }
  end

  -- schedule.claim_capped: the wait when a start would find the places all others' (nil: none).
  local function full_wait()
    if cap == nil then
      return nil
    end
    local places = live_places(keys[4], now)
    for i = 1, #places, 2 do
      if places[i] == place then
        return nil
      end
    end
    if keys[5] ~= nil then
      local settling = born_us(keys[5], nil, now, false) + PLACE_SETTLE_US - now
      if settling > 0 then
        return settling
      end
    end
    if #places / 2 >= cap then
      return math.min(tonumber(places[2]) - now, PLACE_POLL_US)
    end
    return nil
  end

  local function seat()
    if cap ~= nil then
      put_place(keys[4], place, now + place_us, now)
    end
  end

  local s, is_new = load_or_new(keys[1], keys[5], now, interval)
  if is_new then
    save_state(keys[1], s, now, interval)
  end
  local raw = load_mark(keys[2])
  local m = live(raw, now)
  if raw ~= nil and m == nil then
    drop_mark(keys[2])
  end
  if s.p ~= nil then
    return reply(s, 'PAUSED', 0)
  end
  local v = virtual_now(s, now)
  local spacing = effective_interval(s, interval)
  local primary = earliest_start(s, spacing, burst, cost)
  local front = m ~= nil and m.kind == 'G' and m.front and m.e == s.e
  local missed, moves = nil, false
  if m ~= nil and m.kind ~= 'G' then
    if m.kind == 'D' then
      return reply(s, 'DUPLICATE', 0)
    end
    if m.holder ~= holder then
      local left = m.exp - now
      return reply(s, 'HELD', left, 'delay', left)
    end
    if m.start >= math.max(v, s.w or v) then
      local wait = full_wait()
      if wait ~= nil then
        return reply(s, 'FULL', wait, 'delay', wait)
      end
      seat()
      return reply(s, 'OK', m.start - v, 'start', now + m.start - v,
        'late', math.max(0, m.start - slot - s.u), 'again', 1)
    end
    -- The holder never heard of its admitted start (a lost reply, its pool process came late)
    -- and it has passed, or a throttle since moved it into its wait (w): it never happened.
    -- While no start was admitted after it, it moves to now; else a new one is admitted after
    -- the last, as if that one had happened.
    missed = m
    slot = s.c
    moves = m.e == s.e and m.admitted == s.s and m.tat == start_tat(s, spacing, burst)
    if moves then
      primary = m.start
    end
  elseif epoch ~= s.e or (slot < s.c and not front) then
    return reply(s, 'RETICKET', 0)
  end
  local earliest = lim_earliest_start(s, limits, cost, primary)
  if not_before ~= nil then
    earliest = math.max(earliest, not_before)
  end
  if s.h ~= nil and not front then
    earliest = math.max(earliest, s.h + spacing)
  end
  if s.w ~= nil then
    earliest = math.max(earliest, s.w)
  end
  if missed == nil then
    earliest = math.max(slot + (front and 0 or s.u), earliest)
  end
  lead = clamp_lead(lead)
  if v + lead < earliest then
    return reply(s, 'WAIT', earliest - v, 'delay', earliest - v)
  end
  local wait = full_wait()
  if wait ~= nil then
    return reply(s, 'FULL', wait, 'delay', wait)
  end
  seat()
  local start = math.max(v + math.min(math.max(0, handoff), lead, spacing), earliest)
  lim_after_start(s, start, limits, cost)
  if moves then
    moved(s, start, spacing, burst, cost)
  else
    after_start(s, start, spacing, burst, cost)
  end
  if front then
    if s.h ~= nil and slot >= s.h then
      s.h = nil
    end
  else
    s.c = slot
  end
  local late = math.max(0, start - slot - (front and 0 or s.u))
  local fields = { 'l', 'c', 'h', 'q', 'z', 'x', 's' }
  -- schedule.core._pushed: the tickets still waiting go back, so none meets the new start.
  if missed ~= nil and s.g ~= nil and s.c < s.g then
    if moves then
      s.u = s.u + math.max(0, start - missed.start)
    else
      s.u = s.u + math.max(1, cost) * spacing
    end
    fields[#fields + 1] = 'u'
  end
  if s.a ~= nil then
    eased(s, interval)
    fields[#fields + 1] = 'a'
    fields[#fields + 1] = 'k'
  end
  s.s = s.s + 1
  save_fields(keys[1], s, false, now, interval, unpack(fields))
  put_mark(keys[2], { kind = 'L', holder = holder, start = start, exp = now + lease, e = s.e,
    tat = start_tat(s, effective_interval(s, interval), burst), admitted = s.s }, now)
  if moves then
    return reply(s, 'OK', start - v, 'start', now + start - v, 'late', late, 'readmit', 1,
      'moved', 1)
  elseif missed ~= nil then
    return reply(s, 'OK', start - v, 'start', now + start - v, 'late', late, 'readmit', 1)
  end
  return reply(s, 'OK', start - v, 'start', now + start - v, 'late', late)
end

-- held_op: take.lua's answer while another holder's lease of the copy is live: HELD (the lease
-- left as the delay, no ticket), a new epoch saved. KEYS as grant_op's, ARGV as take.lua's;
-- paused is also 1 when outer_paused (a nested bucket's outer, take_nested.lua).
-- Ledger: op=grant:HELD now task r holder delay epoch interval (effective).
local function held_op(keys, argv, now, lease, outer_paused)
  local interval = tonumber(argv[2])
  local s, is_new = load_or_new(keys[1], keys[5], now, interval)
  if is_new then
    save_state(keys[1], s, now, interval)
  end
  local left = lease.exp - now
  ledger_append(keys[3], tonumber(argv[6]), {
    'op', 'grant:HELD', 'now', now, 'task', argv[4], 'r', tonumber(argv[5]),
    'holder', argv[7], 'delay', left, 'epoch', s.e, 'interval', effective_interval(s, interval),
  })
  return { 'HELD', s.e, 0, 0, left, (s.p ~= nil or outer_paused) and 1 or 0 }
end

-- take_op: schedule.take — grant, then claim in the same step when the slot is due within the
-- lead and the bucket runs: a task whose turn is now takes its ticket and start in one trip.
-- KEYS as grant.lua's. ARGV[1..6] as grant.lua's, then ARGV[7] holder, ARGV[8] lease_us,
-- ARGV[9] lead_us, ARGV[10] handoff_us, ARGV[11] cap, ARGV[12] place_us, ARGV[13] place name
-- (as claim.lua's), ARGV[14] burst, ARGV[15] cost (units; absent: 1), ARGV[16] not_after_in_us
-- ('' = none, as grant.lua's ARGV[9]), ARGV[17] the grant's extra limits (grant.lua's ARGV[10]),
-- ARGV[18] the claim's (claim.lua's ARGV[18]; absent: ARGV[17]), ARGV[19] an interactive
-- start's share (grant.lua's ARGV[11]; absent or '': none).
-- Returns grant.lua's reply, followed by claim.lua's when it claimed (10 values); grant's
-- outcome is HELD (delay = the lease left, no ticket) while another holder's lease is live.
-- Ledger: op=grant:HELD now task r holder delay epoch interval (effective) for that.
local function take_op(keys, argv)
  local now = fmt(clock_us(argv[1]))
  local lease = live(load_mark(keys[2]), tonumber(now))
  if lease ~= nil and lease.kind == 'L' and lease.holder ~= argv[7] then
    return held_op(keys, argv, tonumber(now), lease, false)
  end
  local g = grant_op(keys, {
    now, argv[2], argv[3], argv[4], argv[5], argv[6], argv[14], argv[15], argv[16], argv[17],
    argv[19],
  })
  if g[1] ~= 'OK' or g[6] == 1 or g[5] > clamp_lead(tonumber(argv[9])) then
    return g
  end
  local c = claim_op(keys, {
    now, argv[2], g[2], g[4], argv[7], argv[8], argv[9], argv[4], argv[5], g[3], argv[6], argv[10],
    argv[11], argv[12], argv[13], argv[14], argv[15], argv[18] or argv[17],
  })
  return { g[1], g[2], g[3], g[4], g[5], g[6], c[1], c[2], c[3], c[4] }
end
