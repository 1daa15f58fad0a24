-- claim_nested.lua: schedule.outer.claim_nested (outer.lua's nested_claim_op, whose comment
-- gives KEYS, ARGV and the reply).
return nested_claim_op(KEYS, claimer_args(ARGV, KEYS[7], KEYS[8]))
