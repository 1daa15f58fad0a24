-- reset.lua: forget the bucket's state; the next operation starts a new epoch, born at the
-- reset (its first start waits one interval): the hash keeps only r=<now> until then.
-- KEYS[1] state hash, KEYS[2] ledger stream
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] ledger_max (0 = no ledger)
-- Returns 1 if a state was forgotten, else 0. Marks are kept (dedupe survives a reset), and so
-- is the ledger. Ledger: op=reset now.
local now = clock_us(ARGV[1])
local forgot = load_state(KEYS[1]) ~= nil and 1 or 0
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'r', fmt(now))
HELD[KEYS[1]] = nil
ledger_append(KEYS[2], tonumber(ARGV[2]), { 'op', 'reset', 'now', now })
return forgot
