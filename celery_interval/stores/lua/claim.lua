-- claim.lua: schedule.claim (ops.lua's claim_op, whose comment gives KEYS, ARGV and the reply).
return claim_op(KEYS, claimer_args(ARGV, KEYS[5], KEYS[6]))
