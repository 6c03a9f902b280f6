-- Reclaim expired permits and hand free ones to waiters. Workers run it
-- periodically so that a crashed holder's slot is not idle until someone
-- releases.
-- KEYS   the pool's keys in lib.lua order (permits … parked)
-- ARGV[1] default permit limit
-- ARGV[2] lease ms
-- ARGV[3] liveness key prefix
-- Returns the ids granted a permit; the caller must notify them.
local now = now_ms()
expire_permits(now)
return pump(pool_limit(ARGV[1]), tonumber(ARGV[2]), ARGV[3], now)
