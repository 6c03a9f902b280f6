-- Note which Redis process serves a pool's keys, and say whether it is
-- not the one noted before.
-- KEYS[1] the pool's epoch key (in the pool's hash slot)
-- ARGV[1] run id of the process serving that slot now (INFO server)
-- Returns 0: the same process as before. 1: no epoch was noted — the
-- pool's keys were lost (an empty restart, a flush) or this is the first
-- run. 2: another process serves them — a failover, or a restart that
-- kept its data: the writes of the last moments before it may be lost.
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
if not cur then
  return 1
end
return 2
