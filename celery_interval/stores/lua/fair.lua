-- fair.lua: schedule.fair — an outer bucket's starts divided among the inner buckets (keys)
-- that wait, by weight (start-time fair queuing). RedisStore prepends it to the nested
-- scripts, before outer.lua. The share is a hash beside the outer's state (KEYS[6] of the
-- nested scripts): v = the fair time (µs), and one field k:<key> per key that waits or is
-- ahead of the fair time, "<finish_us>|<want_until_us>|<weight>|<due_us>" (schedule.fair.Tag).
-- Integer arithmetic as the model's: idiv is Python's //.

local WANT_GRACE_INTERVALS = 4
local TURN_EARLY_NUM, TURN_EARLY_DEN = 7, 8
local MIN_TURN_WAIT_US = 5000
local MAX_TURN_WAIT_US = 1000000
-- The share of an outer bucket idle this long goes (its keys would start at the fair time).
local FAIR_TTL_MS = 86400000

-- floor(n / d) for integers below 2^53 and d > 0, exact where the double quotient rounds.
local function idiv(n, d)
  local q = math.floor(n / d)
  if q * d > n then
    q = q - 1
  elseif (q + 1) * d <= n then
    q = q + 1
  end
  return q
end

-- The share at key: {v, tags = {key = {finish, want, weight, due}}}.
local function fair_load(key)
  local raw = redis.call('HGETALL', key)
  local f = { v = 0, tags = {} }
  for i = 1, #raw, 2 do
    if raw[i] == 'v' then
      f.v = tonumber(raw[i + 1])
    else
      local finish, want, weight, due = string.match(raw[i + 1], '^(-?%d+)|(-?%d+)|(%d+)|(-?%d+)$')
      f.tags[string.sub(raw[i], 3)] = { finish = tonumber(finish), want = tonumber(want),
        weight = tonumber(weight), due = tonumber(due) }
    end
  end
  return f
end

local function fair_save(key, f)
  local args = { 'HSET', key, 'v', fmt(f.v) }
  for k, t in pairs(f.tags) do
    args[#args + 1] = 'k:' .. k
    args[#args + 1] = fmt(t.finish) .. '|' .. fmt(t.want) .. '|' .. fmt(t.weight) .. '|' .. fmt(t.due)
  end
  redis.call('DEL', key)
  redis.call(unpack(args))
  redis.call('PEXPIRE', key, FAIR_TTL_MS)
end

-- schedule.fair.FairShare.tag_of: key's tag with weight (a new one at the fair time).
local function fair_tag_of(f, key, weight)
  local t = f.tags[key]
  if t == nil then
    return { finish = f.v, want = 0, weight = weight, due = 0 }
  end
  return { finish = t.finish, want = t.want, weight = weight, due = t.due }
end

local function fair_start_tag(f, t)
  return math.max(f.v, t.finish)
end

-- schedule.fair._with: key's tag in place; keys neither waiting nor ahead of v dropped.
local function fair_with(f, key, tag, now)
  for k, t in pairs(f.tags) do
    if k ~= key and not (t.want >= now or t.finish > f.v) then
      f.tags[k] = nil
    end
  end
  f.tags[key] = tag
end

-- schedule.fair._starts_before: the starts of one unit t's key takes before fair time before.
local function fair_starts_before(f, t, before, spacing)
  local step = math.max(1, idiv(spacing, math.max(1, t.weight)))
  return math.max(0, -idiv(fair_start_tag(f, t) - before, step))
end

-- schedule.fair.turn: key (weight) claims, its own limits admitting it, free_in µs before the
-- outer's budget is free (negative: free since), lead µs ahead at most. Returns the wait
-- (0: it may start), the share changed in f (key waiting).
local function fair_turn(f, key, weight, now, spacing, free_in, lead)
  local tag = fair_tag_of(f, key, weight)
  local mine = fair_start_tag(f, tag)
  local free_by = now + math.max(free_in, 0)
  local others, first = {}, mine
  for k, t in pairs(f.tags) do
    if k ~= key and t.want >= now and t.due <= free_by then
      others[#others + 1] = t
      local at = fair_start_tag(f, t)
      if #others == 1 or at < first then
        first = at
      end
    end
  end
  local wait = math.max(0, free_in - lead)
  if mine > first and free_in > -math.max(idiv(spacing, 2), 2000) then
    local ahead = 0
    for _, t in ipairs(others) do
      ahead = ahead + fair_starts_before(f, t, mine, spacing)
    end
    local ahead_us = idiv(ahead * spacing * TURN_EARLY_NUM, TURN_EARLY_DEN)
    wait = math.min(math.max(MIN_TURN_WAIT_US, free_in + ahead_us - lead), MAX_TURN_WAIT_US)
  end
  tag.want = now + wait + WANT_GRACE_INTERVALS * spacing
  tag.due = now + wait
  fair_with(f, key, tag, now)
  return wait
end

-- schedule.fair.started: key started cost units; it may start again from due by its own limits.
local function fair_started(f, key, weight, cost, spacing, now, due)
  local tag = fair_tag_of(f, key, weight)
  local start = fair_start_tag(f, tag)
  f.v = math.max(f.v, start)
  fair_with(f, key, { finish = start + idiv(math.max(1, cost) * spacing, math.max(1, weight)),
    want = math.max(now, due) + WANT_GRACE_INTERVALS * spacing, weight = weight, due = due }, now)
end
