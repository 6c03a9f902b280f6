-- Reclaim expired permits and hand free ones to waiters. Workers run it
-- periodically so that a crashed holder's slot is not idle until someone
-- releases.
-- KEYS[1] permits  KEYS[2] grants  KEYS[3] queue  KEYS[4] stats
-- ARGV[1] default permit limit
-- ARGV[2] lease ms
-- ARGV[3] liveness key prefix
-- Returns the ids granted a permit; the caller must notify them.
local permits, grants, queue, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms()
expire_permits(permits, grants, now)
return pump(permits, grants, queue, ARGV[3], pool_limit(stats, ARGV[1]), tonumber(ARGV[2]), now)
