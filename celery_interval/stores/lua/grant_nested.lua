-- grant_nested.lua: schedule.outer.grant_nested (outer.lua's nested_grant_op, whose comment
-- gives KEYS, ARGV and the reply).
return nested_grant_op(KEYS, ARGV)
