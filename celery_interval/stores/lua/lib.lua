-- lib.lua: helpers shared by every script; RedisStore prepends this file to each script.
-- Mirrors celery_interval/schedule/. All times are integer µs held in Lua doubles
-- (exact below 2^53); every number written to Redis goes through fmt() ('%d'), because
-- Redis formats plain Lua numbers with 14 significant digits and would round µs values.
-- State hash fields: e=epoch o=offset_us p=paused_at_real_us (absent: not paused)
-- t=tat_us n=ticket c=current_slot_us l=last_start_us i=interval_override_us (absent: none)
-- h=reserved_us (a throttled task's kept slot; absent: none) a=adapted_us (an adaptive bucket's
-- lengthened interval; absent: none) k=clean_starts (absent: 0) q=start_extra_us (absent: 0)
-- g=last_slot_us (absent: none) z=lost_start_us (absent: none) m=the master_replid of the
-- master that last saved it (fenced scripts only; absent otherwise) x=the extra limits' times
-- (limit_tats: "<grant_us>:<start_us>" per limit, comma-separated, in the order of the bucket's
-- limits, an empty side for none; absent: none, as in records written before limits existed)
-- f=front_tat_us (the interactive starts' GCRA, front.lua; absent: none) u=pushed_us (how far
-- the interactive starts pushed the tickets: t, g, c and the limits' grants' times are in ticket
-- time, virtual time minus u; absent: 0) w=throttled_until_us (the end of the latest throttle's
-- wait, virtual time: a lease whose start is before it is not started again; absent: none).
-- A reset bucket's hash holds only r=<reset time>, until its next state is made.
-- FENCED (a line RedisStore puts before this file): true on a replicated store (Sentinel,
-- Cluster), where a master may be a replica promoted without the old master's last writes.
-- The store's birth marker: the key <prefix>born (µs), set by the first script that makes a
-- state and finds it missing; scripts on a Cluster get no such key (see born_us).
-- Mark strings: lease "L|<holder>|<start_us>|<expires_real_us>|<epoch>|<tat_us>|<admitted>",
-- a nested bucket's with "|O<outer_tat_us>" after (parse_mark), done "D|<expires_real_us>",
-- granted "G|<epoch>|<ticket>|<slot_us>|<expires_real_us>", a throttled task's front grant
-- the same with "F" for "G".
-- A capped bucket's places: a sorted set (same hash tag) of the running bodies' names
-- (task_id:retries) scored by expires_real_us; schedule.Place.
-- The ledger: a capped Stream per bucket (same hash tag); scripts append one entry per grant,
-- claim and control action with ledger_append (cap 0 = ledger off).

local function fmt(x)
  return string.format('%d', x)
end

-- The store's clock: Redis TIME, read once per call (a call is one instant: take's claimer
-- and its operation, take_many's takes), unless a (test-only) override is given.
local NOW_US = nil
local function clock_us(override)
  if override ~= nil and override ~= '' then
    return tonumber(override)
  end
  if NOW_US == nil then
    local t = redis.call('TIME')
    NOW_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return NOW_US
end

local function num(v)
  if v == false or v == nil then
    return nil
  end
  return tonumber(v)
end

-- The x field as a list of {g = grant_us or nil, s = start_us or nil} (schedule.LimitTats).
local function decode_tats(raw)
  local tats = {}
  if raw == false or raw == nil or raw == '' then
    return tats
  end
  for g, st in string.gmatch(raw .. ',', '(%-?%d*):(%-?%d*),') do
    tats[#tats + 1] = { g = tonumber(g), s = tonumber(st) }
  end
  return tats
end

local function encode_tats(tats)
  local parts = {}
  for i, t in ipairs(tats) do
    parts[i] = (t.g and fmt(t.g) or '') .. ':' .. (t.s and fmt(t.s) or '')
  end
  return table.concat(parts, ',')
end

-- schedule.limits.next_grant_tat: tat, or the latest of the limits' grants' times if later.
local function lim_next_grant(s, tat)
  for _, t in ipairs(s.x) do
    tat = math.max(tat, t.g or tat)
  end
  return tat
end

-- The state hash's fields in the order load_state reads them (HMGET), and each one's place.
local STATE_FIELDS = { 'e', 'o', 'p', 't', 'n', 'c', 'l', 'i', 'r', 'h', 'a', 'k', 'q', 'g', 'z',
  'm', 'x', 'f', 'u', 'w', 's' }
local STATE_INDEX = {}
-- (a numeric loop: a Functions library runs this as it loads, where ipairs is not defined)
for i = 1, #STATE_FIELDS do
  STATE_INDEX[STATE_FIELDS[i]] = i
end

-- The state hashes this call read or wrote, each as HMGET of STATE_FIELDS would return it now
-- (false: absent): save_state and save_fields keep it, so a state is read from Redis once per
-- call (take's claim after its grant, take_many's takes of one bucket). Every other write of a
-- state hash must drop its entry.
local HELD = {}

-- Record in HELD the fields written (name, value, ...) and removed (names) at key.
local function hold(key, written, removed)
  local r = HELD[key]
  if r == nil then
    return
  end
  for _, f in ipairs(removed) do
    r[STATE_INDEX[f]] = false
  end
  for i = 1, #written, 2 do
    r[STATE_INDEX[written[i]]] = written[i + 1]
  end
end

-- The state at key, or nil and the time of the bucket's reset (nil if none) when it has none.
local function load_state(key)
  local r = HELD[key]
  if r == nil then
    r = redis.call('HMGET', key, unpack(STATE_FIELDS))
    HELD[key] = r
  end
  if r[1] == false then
    return nil, num(r[9])
  end
  return {
    e = num(r[1]), o = num(r[2]), p = num(r[3]), t = num(r[4]),
    n = num(r[5]), c = num(r[6]), l = num(r[7]), i = num(r[8]), h = num(r[10]),
    a = num(r[11]), k = num(r[12]) or 0, q = num(r[13]) or 0, g = num(r[14]), z = num(r[15]),
    m = r[16] or nil, x = decode_tats(r[17]), f = num(r[18]), u = num(r[19]) or 0,
    w = num(r[20]), s = num(r[21]) or 0,
  }
end

-- schedule.MAX_LEAD_US: a claim admits a start at most this far ahead.
local MAX_LEAD_US = 20000
-- schedule.GRANTED_TTL_US: a granted slot is remembered this long after its delay.
local GRANTED_TTL_US = 3600000000
-- schedule.IDLE_GRACE_US: an idle state is kept this long after a new one would act the same.
local IDLE_GRACE_US = 600000000

-- schedule.clamp_lead: a claim's lead, kept within 0..MAX_LEAD_US.
local function clamp_lead(lead)
  return math.min(math.max(0, lead), MAX_LEAD_US)
end

-- schedule.new_state: a new epoch whose last start was one interval ago, but never before
-- born + MAX_LEAD_US (a state lost at born may have admitted a start that far ahead, and used
-- a burst then: z); tat is one interval after it.
local function new_state(now, interval, born)
  local last = math.max(now - interval, born + MAX_LEAD_US)
  return { e = now, o = 0, p = nil, t = last + interval, n = 0, c = 0, l = last, i = nil, h = nil,
    a = nil, k = 0, q = 0, g = nil, z = born + MAX_LEAD_US, x = {}, f = nil, u = 0,
    w = nil, s = 0 }
end

-- schedule.new_state's born_us: the birth marker at born_key (set to now when missing, if
-- set_missing), or the bucket's reset if later. A Cluster passes no born_key (a script may touch
-- only keys of one hash slot): born = now, so a new bucket's first start waits one interval.
-- BORN: the marker's value as this call read or wrote it (false: none), read once per call.
local BORN = {}
local function born_us(born_key, reset, now, set_missing)
  if born_key == nil then
    return now
  end
  if BORN[born_key] == nil then
    BORN[born_key] = num(redis.call('GET', born_key)) or false
  end
  local born = BORN[born_key] or nil
  if born == nil then
    born = now
    if set_missing then
      redis.call('SET', born_key, fmt(now))
      BORN[born_key] = now
    end
  end
  if reset ~= nil then
    return math.max(born, reset)
  end
  return born
end


-- schedule.virtual_now
local function virtual_now(s, now)
  local real = now
  if s.p ~= nil then
    real = s.p
  end
  return real - s.o
end

-- schedule.effective_interval: an override, else the interval an adaptive bucket's throttles
-- lengthened, else the configured one.
local function effective_interval(s, interval)
  if s.i ~= nil then
    return s.i
  end
  if s.a ~= nil then
    return math.max(s.a, interval)
  end
  return interval
end

-- schedule.burst: the grants' and the starts' GCRA of a bucket's burst and a task's cost (units
-- of one interval's budget).
-- schedule.burst.room: a start may come this many intervals before its tat.
local function room(burst, cost)
  return math.max(0, math.max(1, burst) - math.max(1, cost))
end

-- schedule.burst.start_tat: the starts' theoretical arrival time.
local function start_tat(s, spacing, burst)
  local tat = s.l + spacing + s.q
  if s.z ~= nil then
    tat = math.max(tat, s.z + math.max(1, burst) * spacing)
  end
  return tat
end

-- schedule.burst.earliest_start
local function earliest_start(s, spacing, burst, cost)
  return start_tat(s, spacing, burst) - room(burst, cost) * spacing
end

-- schedule.burst.after_start: s after a start of cost at start (l never goes back).
local function after_start(s, start, spacing, burst, cost)
  local tat = math.max(start_tat(s, spacing, burst), start) + math.max(1, cost) * spacing
  s.l = math.max(s.l, start)
  s.q = tat - s.l - spacing
  s.z = nil
end

-- schedule.burst.moved: s after its last admitted start, which never happened, moved to the
-- later start.
local function moved(s, start, spacing, burst, cost)
  local tat = math.max(start_tat(s, spacing, burst), start + math.max(1, cost) * spacing)
  s.l = math.max(s.l, start)
  s.q = tat - s.l - spacing
  s.z = nil
end

-- schedule.burst.grant_tat
local function grant_tat(s, spacing, burst)
  if s.z == nil then
    return s.t
  end
  return math.max(s.t, s.z + math.max(1, burst) * spacing)
end

-- schedule.burst.next_slot: the grants' GCRA, never before the latest granted slot.
local function next_slot(s, v, spacing, burst, cost)
  local slot = math.max(v, grant_tat(s, spacing, burst) - room(burst, cost) * spacing)
  if s.g ~= nil then
    slot = math.max(slot, s.g)
  end
  return slot
end

-- schedule.burst.units_left: the whole units of a budget of burst a GCRA at tat has left at v.
local function units_left(tat, v, spacing, burst)
  return math.max(0, math.max(1, burst) - math.max(0, math.ceil((tat - v) / spacing)))
end

-- schedule.burst.after_grant
local function after_grant(s, slot, spacing, burst, cost)
  s.t = math.max(grant_tat(s, spacing, burst), slot) + math.max(1, cost) * spacing
  s.g = slot
end

-- schedule.burst.emptied: the burst all used at the last start (a throttle); returns the
-- earliest start of cost then.
local function emptied(s, spacing, burst, cost)
  local tat = math.max(start_tat(s, spacing, burst), s.l + math.max(1, burst) * spacing)
  local slot = tat - room(burst, cost) * spacing
  s.t = math.max(grant_tat(s, spacing, burst), slot + math.max(1, burst) * spacing)
  s.q = tat - s.l - spacing
  s.z = nil
  return slot
end

-- schedule.burst.rescaled_extra: q in whole units (rounded up) of the new interval. The
-- quotient of integers below 2^53 is exact enough for ceil.
local function rescaled_extra(extra, old, new)
  if extra == 0 or old == new then
    return extra
  end
  return math.ceil(extra / math.max(1, old)) * new
end

-- schedule.ADAPT_CLEAN_RUN and schedule.ADAPT_STEPS
local ADAPT_CLEAN_RUN = 20
local ADAPT_STEPS = 2000

-- schedule.eased: after a clean start, an adapted interval goes back toward the configured one
-- (1/ADAPT_STEPS of its rate added); at it, the adaptation ends.
local function eased(s, interval)
  if s.a == nil then
    return
  end
  local a = math.floor(s.a / (1 + s.a / (interval * ADAPT_STEPS)))
  if a <= interval then
    s.a = nil
  else
    s.a = a
  end
  s.k = s.k + 1
end

-- schedule.slowed: a throttle of an adaptive bucket lengthens its interval by half when it came
-- within ADAPT_CLEAN_RUN starts, else by a ninth; at most adapt_max. Not when overridden.
local function slowed(s, interval, adapt_max)
  if s.i ~= nil then
    return
  end
  local current = effective_interval(s, interval)
  local longer
  if s.a ~= nil and s.k < ADAPT_CLEAN_RUN then
    longer = math.floor((current * 3 + 1) / 2)
  else
    longer = math.floor((current * 10 + 8) / 9)
  end
  s.a = math.max(interval, math.min(adapt_max, longer))
  s.k = 0
end

-- schedule._respaced: s under the override override (nil: none); when the effective interval
-- grows, tat moves on by the difference, never backwards.
local function respace(s, interval, override)
  local old = effective_interval(s, interval)
  s.i = override
  local new = effective_interval(s, interval)
  s.t = s.t + math.max(0, new - old)
  s.q = rescaled_extra(s.q, old, new)
end

-- schedule.front._shifted: t, g and the limits' grants' times by later (ticket time to
-- virtual).
local function front_shift(s, by)
  if by == 0 then
    return
  end
  s.t = s.t + by
  if s.g ~= nil then
    s.g = s.g + by
  end
  for _, t in ipairs(s.x) do
    if t.g ~= nil then
      t.g = t.g + by
    end
  end
end

-- schedule.expires_in_us: how long after a write at now the state may go; nil: keep it.
-- (schedule.front.latest_tat: the grants' times in virtual time, the share's GCRA.)
local function expires_in(s, now, interval)
  if s.p ~= nil or s.i ~= nil or s.a ~= nil then
    return nil
  end
  local v = virtual_now(s, now)
  local settled = math.max(s.t + s.u, s.l + effective_interval(s, interval) + s.q, v, s.f or v)
  for _, t in ipairs(s.x) do
    settled = math.max(settled, t.g and t.g + s.u or settled, t.s or settled)
  end
  return settled - v + IDLE_GRACE_US
end

-- After each write of a state: PEXPIRE (whole ms, rounded up) as expires_in says, or PERSIST.
local function keep_until(key, s, now, interval)
  local e = expires_in(s, now, interval)
  if e == nil then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIRE', key, fmt(math.floor((e + 999) / 1000)))
  end
end

-- Write the whole state (absent fields for nil p, i, h, a, g, z and f, and 0 k, q and u), over a
-- reset's r.
local function save_state(key, s, now, interval)
  local args = { 'e', fmt(s.e), 'o', fmt(s.o), 't', fmt(s.t), 'n', fmt(s.n), 'c', fmt(s.c),
    'l', fmt(s.l) }
  for _, f in ipairs({ 'p', 'i', 'h', 'a' }) do
    if s[f] ~= nil then
      args[#args + 1] = f
      args[#args + 1] = fmt(s[f])
    end
  end
  for _, f in ipairs({ 'k', 'q', 'u', 's' }) do
    if s[f] ~= 0 then
      args[#args + 1] = f
      args[#args + 1] = fmt(s[f])
    end
  end
  for _, f in ipairs({ 'g', 'z', 'f', 'w' }) do
    if s[f] ~= nil then
      args[#args + 1] = f
      args[#args + 1] = fmt(s[f])
    end
  end
  if s.m ~= nil then
    args[#args + 1] = 'm'
    args[#args + 1] = s.m
  end
  if #s.x > 0 then
    args[#args + 1] = 'x'
    args[#args + 1] = encode_tats(s.x)
  end
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(args))
  HELD[key] = {}
  hold(key, args, STATE_FIELDS)
  keep_until(key, s, now, interval)
end

-- This master's replication id on a fenced store (a promoted replica gets a new one), else nil.
local function incarnation()
  if not FENCED then
    return nil
  end
  return string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
end

-- schedule.fenced: a state that another master saved last may lack that master's last
-- writes, a start admitted up to MAX_LEAD_US ahead among them: no start before one interval
-- after now + MAX_LEAD_US, and a burst counts as used then (z, as after a lost state); t is in
-- ticket time (u).
local function fence(s, now, interval)
  s.l = math.max(s.l, virtual_now(s, now) + MAX_LEAD_US)
  s.t = math.max(s.t, s.l + effective_interval(s, interval) - s.u)
  s.z = math.max(s.z or s.l, s.l)
end

-- load_state, else a new epoch; the second value says whether it is new (must be saved whole).
-- On a fenced store a state another master saved last is fenced and saved here.
local function load_or_new(key, born_key, now, interval)
  local s, reset = load_state(key)
  local m = incarnation()
  if s == nil then
    s = new_state(now, interval, born_us(born_key, reset, now, true))
    s.m = m
    return s, true
  end
  if m ~= nil and s.m ~= m then
    fence(s, now, interval)
    s.m = m
    save_state(key, s, now, interval)
  end
  return s, false
end

-- Write only the named fields of an existing state (a new one is saved whole).
local function save_fields(key, s, is_new, now, interval, ...)
  if is_new then
    save_state(key, s, now, interval)
    return
  end
  local args, gone, read = {}, {}, HELD[key]
  -- A field this call saw absent needs no HDEL.
  local function drop(f)
    if read == nil or read[STATE_INDEX[f]] ~= false then
      gone[#gone + 1] = f
    end
  end
  for _, f in ipairs({ ... }) do
    if f == 'x' then
      if #s.x == 0 then
        drop(f)
      else
        args[#args + 1] = f
        args[#args + 1] = encode_tats(s.x)
      end
    elseif s[f] == nil or ((f == 'k' or f == 'q' or f == 'u' or f == 's') and s[f] == 0) then
      drop(f)
    else
      args[#args + 1] = f
      args[#args + 1] = fmt(s[f])
    end
  end
  if #gone > 0 then
    redis.call('HDEL', key, unpack(gone))
  end
  if #args > 0 then
    redis.call('HSET', key, unpack(args))
  end
  hold(key, args, gone)
  keep_until(key, s, now, interval)
end

-- A mark's value as {kind='L', holder, start, exp, e, tat, admitted, otat} (the bucket's
-- epoch, starts' tat and admitted count right after the start was admitted, nil in an older
-- lease; otat, a nested bucket's: its outer's starts' tat then, else nil),
-- {kind='D', exp} or
-- {kind='G', e, ticket, slot, exp, front}.
local function parse_mark(raw)
  local kind = string.sub(raw, 1, 1)
  if kind == 'D' then
    return { kind = 'D', exp = tonumber(string.sub(raw, 3)) }
  end
  if kind == 'G' or kind == 'F' then
    local e, ticket, slot, exp = string.match(raw, '^.|(%-?%d+)|(%-?%d+)|(%-?%d+)|(%-?%d+)$')
    return { kind = 'G', e = tonumber(e), ticket = tonumber(ticket), slot = tonumber(slot),
      exp = tonumber(exp), front = kind == 'F' }
  end
  local holder, start, exp, e, tat, admitted, otat = string.match(
    raw, '^L|(.*)|(%-?%d+)|(%-?%d+)|(%-?%d+)|(%-?%d+)|(%-?%d+)|O(%-?%d+)$')
  if holder == nil then  -- not nested
    holder, start, exp, e, tat, admitted = string.match(
      raw, '^L|(.*)|(%-?%d+)|(%-?%d+)|(%-?%d+)|(%-?%d+)|(%-?%d+)$')
  end
  if holder == nil then  -- a lease of an older version: no epoch, tat or count
    holder, start, exp = string.match(raw, '^L|(.*)|(%-?%d+)|(%-?%d+)$')
  end
  return { kind = 'L', holder = holder, start = tonumber(start), exp = tonumber(exp),
    e = tonumber(e), tat = tonumber(tat), admitted = tonumber(admitted), otat = tonumber(otat) }
end

-- The marks this call read or wrote, by key: {raw = value or false, m = parsed or nil}; take
-- reads its copy's mark once for its check, its grant and its claim. A caller that changes a
-- loaded mark must put_mark it; every other write of a mark must drop its entry.
local MARKS = {}

-- The mark at key (parse_mark's table), or nil.
local function load_mark(key)
  local held = MARKS[key]
  if held == nil then
    held = { raw = redis.call('GET', key) }
    MARKS[key] = held
  end
  if not held.raw then
    return nil
  end
  if held.m == nil then
    held.m = parse_mark(held.raw)
  end
  return held.m
end

-- Delete the mark at key.
local function drop_mark(key)
  redis.call('DEL', key)
  MARKS[key] = { raw = false }
end

-- schedule.live: the mark if it has not expired at now.
local function live(m, now)
  if m ~= nil and m.exp > now then
    return m
  end
  return nil
end

-- Whether a live mark is holder's lease: a claim of it answered other than OK says its
-- admitted start has not happened (the ledger's missed=1, see ops.lua's claim_reply): the
-- holder runs the task only after an OK again or a readmit.
local function own_lease(m, holder)
  return m ~= nil and m.kind == 'L' and m.holder == holder
end

-- Store a mark; the value's expiry is authoritative, PX only garbage-collects it 60 s later.
local function put_mark(key, m, now)
  local value
  if m.kind == 'D' then
    value = 'D|' .. fmt(m.exp)
  elseif m.kind == 'G' then
    value = (m.front and 'F|' or 'G|') .. fmt(m.e) .. '|' .. fmt(m.ticket) .. '|' .. fmt(m.slot)
      .. '|' .. fmt(m.exp)
  else
    value = 'L|' .. m.holder .. '|' .. fmt(m.start) .. '|' .. fmt(m.exp)
    if m.e ~= nil then
      value = value .. '|' .. fmt(m.e) .. '|' .. fmt(m.tat) .. '|' .. fmt(m.admitted)
      if m.otat ~= nil then
        value = value .. '|O' .. fmt(m.otat)
      end
    end
  end
  local px = math.max(1, math.floor((m.exp - now) / 1000) + 60000)
  redis.call('SET', key, value, 'PX', fmt(px))
  MARKS[key] = { raw = value }
end

-- schedule.PLACE_POLL_US: a claim finding the places full looks again at most this late.
local PLACE_POLL_US = 50000
-- schedule.PLACE_SETTLE_US: after the store's birth, capped claims wait this long for running
-- bodies to take back their places.
local PLACE_SETTLE_US = 3000000
-- schedule.MARKS_SETTLE_US: a claim by a worker that saw an earlier birth holds new starts
-- this long for the done marks the workers remember to be written again.
local MARKS_SETTLE_US = 3000000

-- A claiming script's ARGV without its last, the claimer (scripts.claimer_arg: the birth it
-- saw, '' = none, after an 'r' when its message was delivered before), as the operation reads
-- them. schedule.places.marks_settle_until_us: a claimer that knew another birth than the
-- marker (born_key; none on a Cluster) moves the end of the done marks' settle window
-- (settle_key, µs) to now + MARKS_SETTLE_US at least; a redelivered message's claim within
-- MARKS_SETTLE_US of the birth, to the birth + MARKS_SETTLE_US at least.
local function claimer_args(argv, born_key, settle_key)
  local args, claimer = { unpack(argv, 1, #argv - 1) }, argv[#argv]
  local redelivered = string.sub(claimer, 1, 1) == 'r'
  local knew = num(redelivered and string.sub(claimer, 2) or claimer)
  if (knew == nil and not redelivered) or born_key == nil then
    return args
  end
  local now = clock_us(args[1])
  local born = born_us(born_key, nil, now, true)
  local till = nil
  if redelivered and now < born + MARKS_SETTLE_US then
    till = born + MARKS_SETTLE_US
  end
  if knew ~= nil and born ~= knew then
    till = math.max(now + MARKS_SETTLE_US, till or 0)
  end
  if till ~= nil then
    till = math.max(till, num(redis.call('GET', settle_key)) or 0)
    redis.call('SET', settle_key, fmt(till), 'PX', fmt(math.floor((till - now) / 1000) + 60000))
  end
  return args
end

-- schedule.live_places: drop the places at key expired by now; the live ones as a ZRANGE
-- WITHSCORES reply (name, expires, ...), ordered by (expires, name).
local function live_places(key, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
  return redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
end

-- Set the place of name to expire at exp (none if exp has passed, as live_places would drop
-- it); the key goes 60 s after its last place expires.
local function put_place(key, name, exp, now)
  if exp <= now then
    redis.call('ZREM', key, name)
    return
  end
  redis.call('ZADD', key, fmt(exp), name)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  local px = math.max(1, math.floor((tonumber(last[2]) - now) / 1000) + 60000)
  redis.call('PEXPIRE', key, fmt(px))
end

-- Append one entry to the ledger Stream at key, trimmed to about cap entries (XADD MAXLEN ~);
-- cap <= 0 writes nothing. fields: name, value, ... (numbers are written with fmt()).
-- redis.LEDGER_TTL_MS: a bucket's ledger goes this long after its last entry (idle tenants).
local LEDGER_TTL_MS = 604800000
-- The ledgers this call appended to: each one's TTL is set once per call.
local LEDGERS = {}

local function ledger_append(key, cap, fields)
  if cap <= 0 then
    return
  end
  local args = { 'XADD', key, 'MAXLEN', '~', fmt(cap), '*' }
  for i = 1, #fields, 2 do
    local value = fields[i + 1]
    if type(value) == 'number' then
      value = fmt(value)
    end
    args[#args + 1] = fields[i]
    args[#args + 1] = value
  end
  redis.call(unpack(args))
  if not LEDGERS[key] then
    redis.call('PEXPIRE', key, LEDGER_TTL_MS)
    LEDGERS[key] = true
  end
end

-- The live places of a capped bucket's running bodies (schedule.status's running).
local function running_places(places_key, now)
  return redis.call('ZCOUNT', places_key, '(' .. fmt(now), '+inf')
end

-- schedule.status as a flat array of integers:
-- {exists, epoch, interval_us, overridden, paused, ticket, next_slot_in_us,
--  current_slot_us, last_start_us, virtual_now_us, adapted, running, units_left...};
-- next_at (virtual; nil: every grants' budget full again) and units (nil: none) as
-- limits.lua's paced_status_reply reads them with the bucket's pace.
local function status_reply(s, exists, now, interval, running, next_at, units)
  local v = virtual_now(s, now)
  local reply = {
    exists and 1 or 0,
    s.e,
    effective_interval(s, interval),
    s.i ~= nil and 1 or 0,
    s.p ~= nil and 1 or 0,
    s.n,
    math.max(0, (next_at or (lim_next_grant(s, s.t) + s.u)) - v),
    s.c,
    s.l,
    v,
    (s.i == nil and s.a ~= nil) and 1 or 0,
    running or 0,
  }
  for _, u in ipairs(units or {}) do
    reply[#reply + 1] = u
  end
  return reply
end


-- Every call begins with empty caches: a script's lib runs anew at each call, but a Functions
-- library's runs once, as it loads, and keeps these between calls (functions.py calls this).
local function call_begins()
  NOW_US = nil
  HELD = {}
  BORN = {}
  MARKS = {}
  LEDGERS = {}
end
