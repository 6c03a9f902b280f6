-- Take one of a semaphore's permits, if one is free. Holders are members
-- of a ZSET scored by when their lease ends (ms, Redis's clock); a holder
-- whose lease ended without a renewal (a crashed process) is dropped
-- first, so its permit comes back by itself.
-- KEYS[1] holders   ARGV[1] holder   ARGV[2] limit   ARGV[3] lease ms
-- Returns 1 if the holder now has a permit (also when it already had
-- one: its lease is renewed), 0 if none is free.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local lease = tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease * 2)
  return 1
end
return 0
