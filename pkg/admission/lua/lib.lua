-- Shared prelude, prepended to every admission script when it is loaded.
-- Key layout of one pool (all keys share the pool's hash tag):
--   permits  ZSET  member = request id, score = lease expiry (ms, Redis clock)
--   grants   HASH  request id -> grant time (ms), to measure service time
--   queue    ZSET  member = request id, score = arrival sequence (FIFO)
--   seq      STRING arrival counter
--   stats    HASH  limit (optional override), ewma_ms (mean permit hold time)
--   alive:<id> STRING waiter liveness mark with TTL; a queue entry whose mark
--             expired belongs to a dead waiter (a zombie) and is skipped.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The effective permit count: a run-time override in stats wins over the
-- configured default passed by the caller.
local function pool_limit(stats, default)
  local v = redis.call('HGET', stats, 'limit')
  if v then return tonumber(v) end
  return tonumber(default)
end

-- Drop permits whose lease ran out (their holder crashed or stalled).
local function expire_permits(permits, grants, now)
  local dead = redis.call('ZRANGEBYSCORE', permits, '-inf', now)
  for _, id in ipairs(dead) do
    redis.call('ZREM', permits, id)
    redis.call('HDEL', grants, id)
  end
end

-- Hand free permits to live waiters at the head of the queue, dropping
-- zombies on the way. Returns the ids granted, in queue order.
local function pump(permits, grants, queue, alive_prefix, limit, lease, now)
  local granted = {}
  local free = limit - redis.call('ZCARD', permits)
  local budget = 1000
  while free > 0 and budget > 0 do
    budget = budget - 1
    local head = redis.call('ZRANGE', queue, 0, 0)
    if #head == 0 then break end
    local id = head[1]
    redis.call('ZREM', queue, id)
    if redis.call('DEL', alive_prefix .. id) == 1 then
      redis.call('ZADD', permits, now + lease, id)
      redis.call('HSET', grants, id, now)
      granted[#granted + 1] = id
      free = free - 1
    end
  end
  return granted
end
