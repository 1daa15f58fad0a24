-- limits.lua: schedule.limits — a bucket's extra limits, each the burst's two GCRAs beside the
-- interval's, their times in the state's field x (lib.lua's decode_tats). RedisStore prepends
-- this file (after lib.lua) to every script.

-- A limits argument "<interval_us>:<burst>,..." ('' or absent: none) as {{t = , b = }, ...}.
local function parse_limits(arg)
  local limits = {}
  if arg == nil or arg == '' then
    return limits
  end
  for t, b in string.gmatch(arg, '(%d+):(%d+)') do
    limits[#limits + 1] = { t = tonumber(t), b = tonumber(b) }
  end
  return limits
end

local function lim_tats(s, i)
  return s.x[i] or {}
end

-- schedule.limits._lost: tat, or later in a new epoch after state loss (z): the burst counts
-- as used then.
local function lim_lost(s, lim, tat)
  if s.z == nil then
    return tat
  end
  local lost = s.z + math.max(1, lim.b) * lim.t
  if tat == nil then
    return lost
  end
  return math.max(tat, lost)
end

-- schedule.limits._with: the first #tats limits' times replaced, later ones kept.
local function lim_with(s, tats)
  for i, t in ipairs(tats) do
    s.x[i] = t
  end
end

-- schedule.limits._earliest: at, or later where cost conforms to every limit's GCRA on side
-- ('s': the starts', 'g': the grants').
local function lim_earliest(s, limits, cost, at, side)
  for i, lim in ipairs(limits) do
    local tat = lim_lost(s, lim, lim_tats(s, i)[side])
    if tat ~= nil then
      at = math.max(at, tat - room(lim.b, cost) * lim.t)
    end
  end
  return at
end

-- schedule.limits._spent: a GCRA's tat (nil: nothing counted) after cost units at at.
local function lim_spent(tat, at, lim, cost)
  if tat ~= nil then
    at = math.max(tat, at)
  end
  return at + math.max(1, cost) * lim.t
end

-- schedule.limits.earliest_start
local function lim_earliest_start(s, limits, cost, earliest)
  return lim_earliest(s, limits, cost, earliest, 's')
end

-- schedule.limits.next_slot
local function lim_next_slot(s, limits, cost, slot)
  return lim_earliest(s, limits, cost, slot, 'g')
end

-- schedule.limits.after_start (before lib.lua's after_start, which ends z)
local function lim_after_start(s, start, limits, cost)
  local tats = {}
  for i, lim in ipairs(limits) do
    local old = lim_tats(s, i)
    local tat = lim_spent(lim_lost(s, lim, old.s), start, lim, cost)
    tats[i] = { g = lim_lost(s, lim, old.g), s = tat }
  end
  lim_with(s, tats)
end

-- schedule.limits.after_grant
local function lim_after_grant(s, slot, limits, cost)
  local tats = {}
  for i, lim in ipairs(limits) do
    local old = lim_tats(s, i)
    tats[i] = { g = lim_spent(lim_lost(s, lim, old.g), slot, lim, cost), s = old.s }
  end
  lim_with(s, tats)
end

-- schedule.limits.emptied (before lib.lua's emptied, which ends z): every limit's burst all
-- used at the last start; first, or later where a limit asks.
local function lim_emptied(s, limits, cost, first)
  local tats = {}
  for i, lim in ipairs(limits) do
    local old = lim_tats(s, i)
    local tat = s.l + math.max(1, lim.b) * lim.t
    local start_tat = lim_lost(s, lim, old.s)
    if start_tat ~= nil then
      tat = math.max(tat, start_tat)
    end
    first = math.max(first, tat - room(lim.b, cost) * lim.t)
    tats[i] = { g = lim_lost(s, lim, old.g), s = tat }
  end
  lim_with(s, tats)
  return first
end

-- schedule.limits.units_left: each limit's grants' budget left at v, appended to units.
local function lim_units_left(s, limits, v, units)
  for i, lim in ipairs(limits) do
    local tat = lim_lost(s, lim, lim_tats(s, i).g)
    units[#units + 1] = tat == nil and math.max(1, lim.b) or units_left(tat, v, lim.t, lim.b)
  end
end

-- schedule.limits.kept: a throttled copy keeps slot; every limit's grants a burst after it.
local function lim_kept(s, slot, limits)
  local tats = {}
  for i, lim in ipairs(limits) do
    local old = lim_tats(s, i)
    local tat = slot + math.max(1, lim.b) * lim.t
    if old.g ~= nil then
      tat = math.max(old.g, tat)
    end
    tats[i] = { g = tat, s = old.s }
  end
  lim_with(s, tats)
end

-- schedule.status with the bucket's pace: status_reply, its next slot the one a ticket of
-- cost 1 gets now and each budget's units left (the interval's, then each extra limit's), when
-- burst_arg (the bucket's burst) is given with limits_arg (parse_limits); without burst_arg,
-- status_reply's own (every grants' budget full again, no units). status.lua and the control
-- scripts pass their optional ARGVs here.
local function paced_status_reply(s, exists, now, interval, running, burst_arg, limits_arg)
  local burst = tonumber(burst_arg)
  if burst == nil then
    return status_reply(s, exists, now, interval, running)
  end
  local limits = parse_limits(limits_arg)
  local spacing = effective_interval(s, interval)
  local v = virtual_now(s, now)
  front_shift(s, s.u) -- the grants' times beside v (schedule.front)
  local next_at = lim_next_slot(s, limits, 1, next_slot(s, v, spacing, burst, 1))
  local units = { units_left(grant_tat(s, spacing, burst), v, spacing, burst) }
  lim_units_left(s, limits, v, units)
  front_shift(s, -s.u)
  return status_reply(s, exists, now, interval, running, next_at, units)
end
