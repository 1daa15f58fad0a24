-- reset.lua: forget the bucket's state; the next operation starts a new epoch.
-- KEYS[1] state hash, KEYS[2] ledger stream
-- ARGV[1] now_us override ('' = Redis TIME), ARGV[2] ledger_max (0 = no ledger)
-- Returns 1 if a state was deleted, else 0. Marks are kept (dedupe survives a reset), and so
-- is the ledger. Ledger: op=reset now.
local now = clock_us(ARGV[1])
local deleted = redis.call('DEL', KEYS[1])
ledger_append(KEYS[2], tonumber(ARGV[2]), { 'op', 'reset', 'now', now })
return deleted
