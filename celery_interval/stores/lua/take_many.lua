-- take_many.lua: take_op for several tasks in one call, one after another (a standalone Redis:
-- their keys may span hash slots). KEYS: each take's KEYS (take.lua's) in turn, ARGV[1] keys per
-- take, ARGV[2] arguments per take, then each take's ARGV (take.lua's) in turn.
-- Returns each take's reply, in order; a take the script failed gets its error as its reply
-- and the takes after it still run (reading states and marks again: lib.lua's HELD and MARKS
-- may miss a write of the failed take).
local nkeys, nargs = tonumber(ARGV[1]), tonumber(ARGV[2])
local replies = {}
for j = 0, #KEYS / nkeys - 1 do
  local keys, argv = {}, {}
  for q = 1, nkeys do
    keys[q] = KEYS[j * nkeys + q]
  end
  for q = 1, nargs do
    argv[q] = ARGV[2 + j * nargs + q]
  end
  local ok, reply = pcall(take_op, keys, claimer_args(argv, keys[5], keys[6]))
  if ok then
    replies[j + 1] = reply
  else
    HELD, MARKS, BORN = {}, {}, {}
    if type(reply) == 'table' and reply.err ~= nil then
      replies[j + 1] = reply
    else
      replies[j + 1] = { err = tostring(reply) }
    end
  end
end
return replies
