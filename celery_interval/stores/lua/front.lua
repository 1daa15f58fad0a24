-- front.lua: schedule.front — interactive starts (slot() of a bucket with a share) ahead of the
-- tickets, within their own GCRA at share x rate (the state's f); the tickets they pass are
-- pushed back in order (u: t, g, c and the limits' grants' times are in ticket time). RedisStore
-- prepends this file (after lib.lua and limits.lua) to every script.

-- schedule.front.share_spacing: interval / share, rounded up (the same double division as the
-- model's).
local function share_spacing(spacing, share)
  return math.max(1, math.ceil(spacing / share))
end

-- schedule.front.ahead: where a grant goes when a ticket would start at virtual ticket: returns
-- slot, front (ahead of the tickets), waits (the share's GCRA puts it later than the budget).
local function front_ahead(s, v, spacing, share, not_before, burst, cost, limits, ticket)
  if share == nil then
    return ticket, false, false
  end
  local budget = math.max(v + math.max(0, not_before),
    lim_earliest_start(s, limits, cost, earliest_start(s, spacing, burst, cost)))
  if s.h ~= nil then
    budget = math.max(budget, s.h + spacing)
  end
  local slot = budget
  if s.f ~= nil then
    slot = math.max(budget, s.f)
  end
  if slot >= ticket then
    return ticket, false, false
  end
  return slot, true, slot > budget
end

-- schedule.front.rebased: once c has reached g, u folds into the grants' times (c stays).
local function front_rebased(s)
  if s.u == 0 or (s.g ~= nil and s.c < s.g) then
    return
  end
  front_shift(s, s.u)
  s.u = 0
end

-- schedule.front.after_front: an interactive start of cost granted the front slot: reserved
-- (h), the share's GCRA (f) moved on, the tickets pushed back by its cost (u), the grants'
-- GCRAs counting it at slot in virtual time; g stays.
local function front_after(s, slot, spacing, share, burst, cost, limits)
  front_rebased(s)
  local pushed = s.u + math.max(1, cost) * spacing
  local last_slot = s.g
  front_shift(s, s.u)
  lim_after_grant(s, slot, limits, cost)
  after_grant(s, slot, spacing, burst, cost)
  front_shift(s, -pushed)
  s.g = last_slot
  s.u = pushed
  s.h = slot
  s.f = math.max(s.f or slot, slot) + math.max(1, cost) * share_spacing(spacing, share)
end
