-- claim.lua: schedule.claim (ops.lua's claim_op, whose comment gives KEYS, ARGV and the reply).
local argv, knew = split_knew(ARGV)
return claim_op(KEYS, argv, knew)
