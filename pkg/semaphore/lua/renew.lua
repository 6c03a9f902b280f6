-- Extend a holder's lease. KEYS[1] holders   ARGV[1] holder   ARGV[2] lease ms
-- Returns 1, or 0 if the holder no longer has a permit (its lease ended).
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local until_ms = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not until_ms or tonumber(until_ms) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease * 2)
return 1
