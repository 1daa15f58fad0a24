-- claim_nested.lua: schedule.outer.claim_nested (outer.lua's nested_claim_op, whose comment
-- gives KEYS, ARGV and the reply).
local argv, knew = split_knew(ARGV)
return nested_claim_op(KEYS, argv, knew)
