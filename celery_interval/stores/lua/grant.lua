-- grant.lua: schedule.grant (ops.lua's grant_op, whose comment gives KEYS, ARGV and the reply).
return grant_op(KEYS, ARGV)
