-- Read a pool's queue for the admin view and the metrics; changes nothing.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] default permit limit
-- Returns {limit, permits in use (unexpired), waiting, ewma_ms,
--          age of the oldest entry in ms (-1 if none), entries parked behind
--          their tenant's cap, n, then n/2 pairs tenant, depth, then m,
--          then m/2 pairs tenant, permits held, then pairs tenant, entries
--          parked}
local now = now_ms()
local oldest = redis.call('ZRANGE', K.since, 0, 0, 'WITHSCORES')
local age = -1
if #oldest == 2 then age = math.max(0, now - tonumber(oldest[2])) end
local depth = redis.call('HGETALL', K.tenants)
local reply = {
  pool_limit(ARGV[1]),
  redis.call('ZCOUNT', K.permits, string.format('(%d', now), '+inf'),
  redis.call('ZCARD', K.queue),
  tonumber(redis.call('HGET', K.stats, 'ewma_ms') or '0'),
  age,
  tonumber(redis.call('HGET', K.stats, 'parked') or '0'),
  #depth,
}
for _, v in ipairs(depth) do
  reply[#reply + 1] = v
end
local held = redis.call('HGETALL', K.held)
reply[#reply + 1] = #held
for _, v in ipairs(held) do
  reply[#reply + 1] = v
end
for _, v in ipairs(redis.call('HGETALL', K.parked)) do
  reply[#reply + 1] = v
end
return reply
