-- take.lua: schedule.take (ops.lua's take_op, whose comment gives KEYS, ARGV and the reply).
return take_op(KEYS, claimer_args(ARGV, KEYS[5], KEYS[6]))
