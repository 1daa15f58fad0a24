-- take.lua: schedule.take (ops.lua's take_op, whose comment gives KEYS, ARGV and the reply).
local argv, knew = split_knew(ARGV)
return take_op(KEYS, argv, knew)
