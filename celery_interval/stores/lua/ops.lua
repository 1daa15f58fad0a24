-- ops.lua: the grant and claim operations as functions of (keys, argv) laid out as grant.lua's
-- and claim.lua's KEYS and ARGV; RedisStore prepends this file (after lib.lua) to the scripts
-- that run them: grant.lua, claim.lua, take.lua (both in one step) and take_many.lua.

-- grant_op's ARGV by name (grant_op's comment gives their meaning).
local function grant_args(argv)
  return {
    now = clock_us(argv[1]),
    interval = tonumber(argv[2]),
    not_before = tonumber(argv[3]),
    task = argv[4],
    retries = tonumber(argv[5]),
    ledger_max = tonumber(argv[6]),
    burst = tonumber(argv[7]) or 1,
    cost = tonumber(argv[8]) or 1,
    not_after = num(argv[9]),
    limits = parse_limits(argv[10]),
    share = num(argv[11]),
  }
end

-- schedule.grant's answers that take no ticket: DUPLICATE for a live done mark, or OK with the
-- same ticket and slot again (again = 1) for a copy whose granted slot no later start has
-- passed; nil: neither. A grant is {outcome, ticket, slot, delay, again, ahead, waits}.
local function grant_again(s, m, v)
  if m == nil then
    return nil
  end
  if m.kind == 'D' then
    return { outcome = 'DUPLICATE', ticket = 0, slot = 0, delay = 0 }
  end
  if m.kind == 'G' and m.e == s.e and (m.front or m.slot >= s.c) then
    return { outcome = 'OK', ticket = m.ticket, slot = m.slot, again = 1,
      delay = math.max(0, m.slot + (m.front and 0 or s.u) - v) }
  end
  return nil
end

-- schedule.grant's new slot: schedule.core._first_slot in virtual time, then
-- schedule.front.ahead. Returns an OK grant with no ticket yet: its slot (ticket time, or
-- virtual for a front grant), delay, ahead and waits.
local function grant_slot(s, a, v, spacing)
  front_rebased(s) -- saved only with a new ticket (a WAIT leaves the state as it was)
  front_shift(s, s.u) -- the grants' times in virtual time
  local slot = math.max(next_slot(s, v, spacing, a.burst, a.cost), v + math.max(0, a.not_before))
  slot = lim_next_slot(s, a.limits, a.cost, slot)
  front_shift(s, -s.u)
  local at, ahead, waits = front_ahead(s, v, spacing, a.share, a.not_before, a.burst, a.cost,
    a.limits, slot)
  return { outcome = 'OK', ticket = 0, slot = ahead and at or slot - s.u, delay = at - v,
    ahead = ahead, waits = waits }
end

-- schedule.grant's WAIT: no ticket taken, nothing changed but a new epoch saved and an expired
-- mark dropped.
local function grant_wait(keys, a, s, is_new, raw, m, g)
  g.outcome = 'WAIT'
  if is_new then
    save_state(keys[1], s, a.now, a.interval)
  end
  if raw ~= nil and m == nil then
    drop_mark(keys[2])
  end
end

-- schedule.grant's new ticket at g's slot: schedule.front.after_front for a grant ahead of the
-- tickets, else limits.after_grant and burst.after_grant in virtual time; the state saved, and
-- a granted mark left unless the copy's task holds a live lease.
local function grant_ticket(keys, a, s, is_new, m, g, spacing)
  s.n = s.n + 1
  if g.ahead then
    front_after(s, g.slot, spacing, a.share, a.burst, a.cost, a.limits)
    save_fields(keys[1], s, is_new, a.now, a.interval, 't', 'n', 'g', 'c', 'h', 'f', 'u', 'x')
  else
    front_shift(s, s.u)
    lim_after_grant(s, g.slot + s.u, a.limits, a.cost)
    after_grant(s, g.slot + s.u, spacing, a.burst, a.cost)
    front_shift(s, -s.u)
    save_fields(keys[1], s, is_new, a.now, a.interval, 't', 'n', 'g', 'c', 'u', 'x')
  end
  g.ticket = s.n
  if m == nil or m.kind ~= 'L' then
    put_mark(keys[2], { kind = 'G', e = s.e, ticket = g.ticket, slot = g.slot,
      exp = a.now + g.delay + GRANTED_TTL_US, front = g.ahead }, a.now)
  end
end

-- grant_op's ledger entry and reply (grant_op's comment gives both).
local function grant_reply(keys, a, s, paused, g)
  local fields = {
    'op', 'grant:' .. g.outcome, 'now', a.now, 'task', a.task, 'r', a.retries,
    'ticket', g.ticket, 'slot', g.slot, 'delay', g.delay, 'epoch', s.e, 'paused', paused,
    'interval', effective_interval(s, a.interval),
  }
  if g.again then
    fields[#fields + 1] = 'again'
    fields[#fields + 1] = 1
  end
  if g.ahead and g.outcome == 'OK' then
    fields[#fields + 1] = 'front'
    fields[#fields + 1] = 1
  end
  ledger_append(keys[3], a.ledger_max, fields)
  return { g.outcome, s.e, g.ticket, g.slot, g.delay, paused }
end

-- grant_op: schedule.grant — the next ticket and slot (lib.lua's next_slot; with no burst
-- max(v, tat)), or v + not_before if later; or the same ticket and slot again for a copy whose
-- granted slot no later start has passed.
-- KEYS[1] state hash, KEYS[2] mark of (task_id, retries), KEYS[3] ledger stream,
-- KEYS[4] the bucket's places (claim_op only), KEYS[5] the birth marker and KEYS[6] the done
-- marks' settle window's end (claim_op only; both absent on a Cluster: lib.lua's born_us)
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
  local a = grant_args(argv)
  local s, is_new = load_or_new(keys[1], keys[5], a.now, a.interval)
  local v = virtual_now(s, a.now)
  local paused = s.p ~= nil and 1 or 0
  local raw = load_mark(keys[2])
  local m = live(raw, a.now)
  local spacing = effective_interval(s, a.interval)
  local g = grant_again(s, m, v)
  if g ~= nil then
    if is_new then
      save_state(keys[1], s, a.now, a.interval)
    end
  else
    g = grant_slot(s, a, v, spacing)
    if g.waits or (a.not_after ~= nil and g.delay > a.not_after) then
      grant_wait(keys, a, s, is_new, raw, m, g)
    else
      grant_ticket(keys, a, s, is_new, m, g, spacing)
    end
  end
  return grant_reply(keys, a, s, paused, g)
end

-- claim_op's ARGV by name (claim_op's comment gives their meaning); limits_arg is ARGV[18]
-- as given, for the ledger.
local function claim_args(argv)
  return {
    now = clock_us(argv[1]),
    interval = tonumber(argv[2]),
    epoch = tonumber(argv[3]),
    slot = tonumber(argv[4]),
    holder = argv[5],
    lease = tonumber(argv[6]),
    lead = tonumber(argv[7]),
    task = argv[8],
    retries = tonumber(argv[9]),
    ticket = tonumber(argv[10]),
    ledger_max = tonumber(argv[11]),
    handoff = tonumber(argv[12]),
    cap = num(argv[13]),
    place_us = tonumber(argv[14]),
    place = argv[15],
    burst = tonumber(argv[16]) or 1,
    cost = tonumber(argv[17]) or 1,
    limits_arg = argv[18],
    limits = parse_limits(argv[18]),
    not_before = num(argv[19]),
    outer_spacing = tonumber(argv[20]) or 0,
  }
end

-- claim_op's ledger entry and reply {outcome, epoch, delay_us, now_us} (claim_op's comment
-- gives both): slot is the claim's (the bucket's current slot for a readmitted start), extra
-- the outcome's own fields (nil: none).
local function claim_reply(keys, a, s, slot, outcome, delay, extra)
  local fields = {
    'op', 'claim:' .. outcome, 'now', a.now, 'task', a.task, 'r', a.retries,
    'ticket', a.ticket, 'slot', slot, 'holder', a.holder, 'epoch', s.e,
    'interval', effective_interval(s, a.interval),
  }
  if a.burst ~= 1 or a.cost ~= 1 then
    fields[#fields + 1] = 'burst'
    fields[#fields + 1] = a.burst
    fields[#fields + 1] = 'cost'
    fields[#fields + 1] = a.cost
  end
  if #a.limits > 0 then
    fields[#fields + 1] = 'limits'
    fields[#fields + 1] = a.limits_arg
  end
  for _, x in ipairs(extra or {}) do
    fields[#fields + 1] = x
  end
  if a.missed and outcome ~= 'OK' then
    fields[#fields + 1] = 'missed'
    fields[#fields + 1] = 1
  end
  ledger_append(keys[3], a.ledger_max, fields)
  local born = ''
  if keys[5] ~= nil then
    born = born_us(keys[5], nil, a.now, true)
  end
  return { outcome, s.e, delay, a.now, born }
end

-- schedule.places.claim_capped's settle_until_us: how long a new start waits for the done
-- marks the workers remember (KEYS[6], lib.lua's claimer_args; 0: no wait).
local function claim_marks_settling(keys, a)
  if keys[6] == nil then
    return 0
  end
  return math.max(0, (num(redis.call('GET', keys[6])) or a.now) - a.now)
end

-- schedule.claim_capped: the wait when a start would find the places all others' (nil: none).
local function claim_full_wait(keys, a)
  if a.cap == nil then
    return nil
  end
  local places = live_places(keys[4], a.now)
  for i = 1, #places, 2 do
    if places[i] == a.place then
      return nil
    end
  end
  if keys[5] ~= nil then
    local settling = born_us(keys[5], nil, a.now, false) + PLACE_SETTLE_US - a.now
    if settling > 0 then
      return settling
    end
  end
  if #places / 2 >= a.cap then
    return math.min(tonumber(places[2]) - a.now, PLACE_POLL_US)
  end
  return nil
end

-- schedule.claim_capped: a start under a cap takes (or renews) its place.
local function claim_seat(keys, a)
  if a.cap ~= nil then
    put_place(keys[4], a.place, a.now + a.place_us, a.now)
  end
end

-- schedule.claim's record and mark: a missing state saved as its new epoch, an expired mark
-- dropped. Returns the state and the live mark (nil: none).
local function claim_load(keys, a)
  local s, is_new = load_or_new(keys[1], keys[5], a.now, a.interval)
  if is_new then
    save_state(keys[1], s, a.now, a.interval)
  end
  local raw = load_mark(keys[2])
  local m = live(raw, a.now)
  if raw ~= nil and m == nil then
    drop_mark(keys[2])
  end
  return s, m
end

-- schedule.core._settled: the reply of a claim that needs no start decided: PAUSED, DUPLICATE,
-- HELD (another holder's lease), or the holder's own admitted start still ahead and not before
-- the latest throttle's wait ends (w): OK again (FULL under a cap whose places are all
-- others'). nil: a start is decided.
local function claim_settled(keys, a, s, m)
  a.missed = own_lease(m, a.holder)
  if s.p ~= nil then
    return claim_reply(keys, a, s, a.slot, 'PAUSED', 0)
  end
  if m == nil or m.kind == 'G' then
    return nil
  end
  if m.kind == 'D' then
    return claim_reply(keys, a, s, a.slot, 'DUPLICATE', 0)
  end
  if m.holder ~= a.holder then
    local left = m.exp - a.now
    return claim_reply(keys, a, s, a.slot, 'HELD', left, { 'delay', left })
  end
  local v = virtual_now(s, a.now)
  if m.start >= math.max(v, s.w or v) then
    local wait = claim_full_wait(keys, a)
    if wait ~= nil then
      return claim_reply(keys, a, s, a.slot, 'FULL', wait, { 'delay', wait })
    end
    claim_seat(keys, a)
    return claim_reply(keys, a, s, a.slot, 'OK', m.start - v, { 'start', a.now + m.start - v,
      'late', math.max(0, m.start - a.slot - s.u), 'again', 1 })
  end
  return nil
end

-- schedule.core._as_its_start_left_it: whether the bucket is exactly as the missed lease's
-- admission left it (same epoch, no start admitted since, the same starts' tat).
local function claim_moves(s, missed, spacing, burst)
  return missed.e == s.e and missed.admitted == s.s and missed.tat == start_tat(s, spacing, burst)
end

-- schedule.claim's terms of a start to decide, as c: v, spacing, front (a throttled task's or
-- an interactive start's front grant), slot, and missed (the holder's own lease, whose start
-- it never heard of: it passed, or a throttle since moved it into its wait (w), so it never
-- happened; then slot is the bucket's current slot) and moves (claim_moves: the missed start
-- moves to now; else a new one is admitted after the last, as if that one had happened).
local function claim_terms(a, s, m)
  local c = {
    v = virtual_now(s, a.now),
    spacing = effective_interval(s, a.interval),
    front = m ~= nil and m.kind == 'G' and m.front and m.e == s.e,
    slot = a.slot,
    missed = nil,
    moves = false,
  }
  if m ~= nil and m.kind ~= 'G' then
    c.missed = m
    c.slot = s.c
    c.moves = claim_moves(s, m, c.spacing, a.burst)
  end
  return c
end

-- schedule.core._earliest: the earliest start (virtual) of c: the bucket's budget (or the
-- missed start, if it moves), every extra limit, the outer bucket's not_before (not when
-- alone: the bucket's own earliest), a reserved slot
-- (h), the end of a throttle's wait (w), and (for a ticket) its slot, pushed by u unless a front
-- grant.
local function claim_earliest(a, s, c, alone)
  local primary = earliest_start(s, c.spacing, a.burst, a.cost)
  if c.moves then
    primary = c.missed.start
  end
  local earliest = lim_earliest_start(s, a.limits, a.cost, primary)
  if a.not_before ~= nil and not alone then
    earliest = math.max(earliest, a.not_before)
  end
  if s.h ~= nil and not c.front then
    earliest = math.max(earliest, s.h + c.spacing)
  end
  if s.w ~= nil then
    earliest = math.max(earliest, s.w)
  end
  if c.missed == nil then
    earliest = math.max(c.slot + (c.front and 0 or s.u), earliest)
  end
  -- schedule.core.claim: a kept slot passed unused goes after the slots later throttles kept
  if c.front and s.h ~= nil and c.slot < s.h and c.v > earliest then
    earliest = math.max(earliest, s.h + c.spacing)
  end
  return earliest
end

-- schedule.core._pushed: after a missed start was admitted again, the tickets still waiting go
-- back (u), so none meets the new start. Returns whether u was set.
local function claim_pushed(a, s, c, start)
  if c.missed ~= nil and s.g ~= nil and s.c < s.g then
    if c.moves then
      s.u = s.u + math.max(0, start - c.missed.start)
    else
      s.u = s.u + math.max(1, a.cost) * c.spacing
    end
    return true
  end
  return false
end

-- schedule.claim's state after c's start at start (virtual), saved, and the holder's lease.
local function claim_started(keys, a, s, c, start)
  lim_after_start(s, start, a.limits, a.cost)
  if c.moves then
    moved(s, start, c.spacing, a.burst, a.cost)
  else
    after_start(s, start, c.spacing, a.burst, a.cost)
  end
  if c.front then
    if s.h ~= nil and c.slot >= s.h then
      s.h = nil
    end
  else
    s.c = c.slot
  end
  local fields = { 'l', 'c', 'h', 'q', 'z', 'x', 's' }
  if claim_pushed(a, s, c, start) then
    fields[#fields + 1] = 'u'
  end
  if s.a ~= nil then
    eased(s, a.interval)
    fields[#fields + 1] = 'a'
    fields[#fields + 1] = 'k'
  end
  s.s = s.s + 1
  save_fields(keys[1], s, false, a.now, a.interval, unpack(fields))
  put_mark(keys[2], { kind = 'L', holder = a.holder, start = start, exp = a.now + a.lease,
    e = s.e, tat = start_tat(s, effective_interval(s, a.interval), a.burst), admitted = s.s },
    a.now)
end

-- claim_op: schedule.claim — may the copy held by `holder` start now?
-- KEYS as grant_op's
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] interval_us, ARGV[3] epoch,
-- ARGV[4] slot_us, ARGV[5] holder, ARGV[6] lease_us, ARGV[7] lead_us (clamped to
-- 0..MAX_LEAD_US), ARGV[8] task_id, ARGV[9] retries, ARGV[10] ticket (these three for the
-- ledger only), ARGV[11] ledger_max (0 = no ledger), ARGV[12] handoff_us (clamped to
-- 0..min(lead, the interval or ARGV[20] if longer)), ARGV[13] cap ('' = none), ARGV[14]
-- place_us, ARGV[15] the body's place name (task_id:retries), ARGV[16] burst, ARGV[17] cost (units; absent: 1), ARGV[18]
-- the bucket's extra limits (as grant_op's ARGV[10]), ARGV[19] no start before this virtual
-- time of the bucket (absent or '': none; an outer bucket's budget, outer.lua), ARGV[20] the
-- outer bucket's interval in force (absent: none; the handoff may take up to it)
-- gate (a fair share's, outer.lua; nil: none): a start the bucket alone admits (or only the
-- outer's budget holds back) asks gate.turn() for its turn, a WAIT (ledger turn=1) unless 0
-- (a readmit asks no turn); a start made tells gate.started(delay_us, its own spacing for its
-- cost).
-- Under a cap (schedule.claim_capped), a claim that would start takes (or renews) its place;
-- when the live places are all others' it is FULL (delay: until the first expires, at most
-- PLACE_POLL_US) and changes nothing else; expired places are dropped then. Until
-- PLACE_SETTLE_US after the store's birth marker (KEYS[5]; none on a Cluster) a claim holding no
-- place is FULL (delay: until then): running bodies take back the places a lost store forgot.
-- A new start WAITs until the done marks' settle window ends (KEYS[6], set by claimer_args;
-- ledger settle=1), before any FULL.
-- Returns {outcome, epoch, delay_us, now_us, born_us ('' on a Cluster)}: OK (start_in), WAIT
-- (wait), FULL (wait), HELD (lease left), PAUSED, DUPLICATE, RETICKET (0). A throttled task's front grant keeps its
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
-- missed one, the bucket's last start), for WAIT, FULL and HELD delay; missed=1 on a claim
-- of the holder's own lease answered other than OK (its admitted start has not happened: it
-- runs only after an OK again or a readmit; lib.lua's own_lease); burst and cost on
-- every claim of a bucket with a burst or a task with a cost (absent: 1); limits (as ARGV[18])
-- on every claim of a bucket with extra limits.
local function claim_op(keys, argv, gate)
  local a = claim_args(argv)
  local s, m = claim_load(keys, a)
  local settled = claim_settled(keys, a, s, m)
  if settled ~= nil then
    return settled
  end
  local c = claim_terms(a, s, m)
  if c.missed == nil and (a.epoch ~= s.e or (a.slot < s.c and not c.front)) then
    return claim_reply(keys, a, s, a.slot, 'RETICKET', 0)
  end
  local earliest = claim_earliest(a, s, c)
  local lead = clamp_lead(a.lead)
  if c.v + lead < earliest then
    if gate ~= nil and c.missed == nil and c.v + lead >= claim_earliest(a, s, c, true)
        and claim_marks_settling(keys, a) == 0 and claim_full_wait(keys, a) == nil then
      local turn = math.max(gate.turn(), earliest - c.v)
      return claim_reply(keys, a, s, c.slot, 'WAIT', turn, { 'delay', turn, 'turn', 1 })
    end
    return claim_reply(keys, a, s, c.slot, 'WAIT', earliest - c.v, { 'delay', earliest - c.v })
  end
  local settling = claim_marks_settling(keys, a)
  if settling > 0 then
    return claim_reply(keys, a, s, c.slot, 'WAIT', settling, { 'delay', settling, 'settle', 1 })
  end
  local wait = claim_full_wait(keys, a)
  if wait ~= nil then
    return claim_reply(keys, a, s, c.slot, 'FULL', wait, { 'delay', wait })
  end
  local turn = (gate ~= nil and c.missed == nil) and gate.turn() or 0
  if turn > 0 then
    return claim_reply(keys, a, s, c.slot, 'WAIT', turn, { 'delay', turn, 'turn', 1 })
  end
  claim_seat(keys, a)
  local reach = math.min(math.max(0, a.handoff), lead, math.max(c.spacing, a.outer_spacing))
  local start = math.max(c.v + reach, earliest)
  -- late: the virtual start past the slot (a ticket's pushed by u: before claim_pushed's push)
  local late = math.max(0, start - c.slot - (c.front and 0 or s.u))
  claim_started(keys, a, s, c, start)
  if gate ~= nil then
    gate.started(start - c.v, math.max(1, a.cost) * effective_interval(s, a.interval))
  end
  local extra = { 'start', a.now + start - c.v, 'late', late }
  if c.missed ~= nil then
    extra[#extra + 1] = 'readmit'
    extra[#extra + 1] = 1
  end
  if c.moves then
    extra[#extra + 1] = 'moved'
    extra[#extra + 1] = 1
  end
  return claim_reply(keys, a, s, c.slot, 'OK', start - c.v, extra)
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
-- Returns grant.lua's reply, followed by claim.lua's when it claimed (11 values); grant's
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
  return { g[1], g[2], g[3], g[4], g[5], g[6], c[1], c[2], c[3], c[4], c[5] }
end
