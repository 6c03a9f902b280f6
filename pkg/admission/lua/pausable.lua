-- A streaming permit holder that can be paused (its pool's backend can
-- continue an answer) says so, with how far it is, every keep-alive
-- round, and learns in the same round trip whether preempt.lua asked it
-- to pause. Standalone: no lib.lua prelude. Its record keeps the Redis
-- time of the first call since its last (re)start (the pause count
-- changes at a restart), so that "running longest since its last pause"
-- is measured on one clock whichever worker streams it. A request that
-- holds no permit has its record and any request dropped.
-- KEYS[1] permits  ZSET  request id -> lease expiry (lib.lua)
-- KEYS[2] pausable HASH  permit holder -> "<rank>:<since ms>:<pauses>:<tokens>"
-- KEYS[3] asked    HASH  victim id -> the waiter it is asked to pause for
-- ARGV[1] request id
-- ARGV[2] its class rank (0: most urgent)
-- ARGV[3] how many times it was paused so far
-- ARGV[4] tokens streamed since its last (re)start
-- Returns the waiter it is asked to pause for, or "" when it is not.
local id, rank, pauses, tokens = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if not redis.call('ZSCORE', KEYS[1], id) then
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  return ''
end
local t = redis.call('TIME')
local since = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local was = redis.call('HGET', KEYS[2], id)
if was then
  local r, s, p = string.match(was, '^(%d+):(%d+):(%d+):')
  if r == rank and p == pauses then since = tonumber(s) end
end
redis.call('HSET', KEYS[2], id, rank .. ':' .. string.format('%.0f', since) .. ':' .. pauses .. ':' .. tokens)
return redis.call('HGET', KEYS[3], id) or ''
