-- reset.lua: forget the bucket's state; the next operation starts a new epoch.
-- KEYS[1] state hash
-- ARGV: none
-- Returns 1 if a state was deleted, else 0. Marks are kept (dedupe survives a reset).
return redis.call('DEL', KEYS[1])
