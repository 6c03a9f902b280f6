-- Shared prelude, prepended to every admission script when it is loaded.
-- Every script gets the pool's keys in this order (renew only the first two);
-- all share the pool's hash tag:
--   KEYS[1] permits ZSET   request id -> lease expiry (ms, Redis clock)
--   KEYS[2] grants  HASH   request id -> grant time (ms), to measure hold time
--   KEYS[3] queue   ZSET   request id -> finish tag F (virtual-time ticks);
--                          the head is the smallest tag
--   KEYS[4] stats   HASH   limit (optional override), ewma_ms (mean permit
--                          hold time), vtime (the pool's virtual time V)
--   KEYS[5] tenants HASH   tenant -> its entries in queue
--   KEYS[6] finish  HASH   tenant -> F of its last entry (F_t); dropped when
--                          the tenant has no entry left
--   KEYS[7] waiters HASH   queued request id -> its tenant
--   KEYS[8] since   ZSET   queued request id -> enqueue time (ms)
--   KEYS[9] weights HASH   queued request id -> its weight (its tier's),
--                          for shedding the lowest tier; entries queued
--                          before it existed have none and are never shed
-- and, by prefix, alive:<id> (waiter liveness mark with a TTL; an entry
-- whose mark expired belongs to a dead waiter, a zombie, and is skipped) and
-- released:<id> (tombstone of a request that gave back what it held).
--
-- Ordering is self-clocked fair queuing. A new entry of tenant t starts at
-- S = max(V, F_t) and finishes at F = S + cost/weight; V moves to the tag of
-- each entry granted from the queue. So one tenant's entries are in arrival
-- order, backlogged tenants share grants in proportion to their weights, an
-- idle tenant comes back at V without banked credit, and a burst of one
-- tenant spreads its entries into the future instead of in front of others.
local K = {
  permits = KEYS[1], grants = KEYS[2], queue = KEYS[3], stats = KEYS[4],
  tenants = KEYS[5], finish = KEYS[6], waiters = KEYS[7], since = KEYS[8],
  weights = KEYS[9],
}

-- Virtual time is counted in integer ticks, TICKS per unit of cost at
-- weight 1: 2520 = lcm(1..10), so weights up to 10 divide exactly. Tags stay
-- integers, exact in a double (and in a ZSET score) up to 2^53 ticks, about
-- 3.6e12 units of cost/weight; V never goes back, so that is the lifetime
-- budget of a pool, decades at thousands of grants per second.
local TICKS = 2520

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The effective permit count: a run-time override in stats wins over the
-- configured default passed by the caller.
local function pool_limit(default)
  local v = redis.call('HGET', K.stats, 'limit')
  if v then return tonumber(v) end
  return tonumber(default)
end

local function vtime()
  return tonumber(redis.call('HGET', K.stats, 'vtime') or '0')
end

-- Drop permits whose lease ran out (their holder crashed or stalled).
local function expire_permits(now)
  local dead = redis.call('ZRANGEBYSCORE', K.permits, '-inf', now)
  for _, id in ipairs(dead) do
    redis.call('ZREM', K.permits, id)
    redis.call('HDEL', K.grants, id)
  end
end

local function grant(id, now, lease)
  redis.call('ZADD', K.permits, now + lease, id)
  redis.call('HSET', K.grants, id, now)
end

-- The length of an entry in ticks: cost/weight, at least one tick.
local function ticks(cost, weight)
  return math.max(1, math.floor(cost * TICKS / weight + 0.5))
end

-- The first tick at or after f that no queued entry holds. ZSET ties would
-- sort by request id; moving a newcomer past the entries already holding its
-- tag keeps equal tags in arrival order, at a cost of a tick each (1/2520 of
-- a unit).
local function free_tick(f)
  while true do
    local last = f + 31
    local taken = redis.call('ZRANGEBYSCORE', K.queue, f, last, 'WITHSCORES')
    for i = 2, #taken, 2 do
      local s = tonumber(taken[i])
      if s > f then return f end
      if s == f then f = f + 1 end
    end
    if f <= last then return f end
  end
end

-- Record a queue entry and count it against its tenant.
local function add_entry(id, tenant, tag, now, weight)
  redis.call('ZADD', K.queue, tag, id)
  redis.call('HSET', K.waiters, id, tenant)
  redis.call('HSET', K.weights, id, weight)
  redis.call('ZADD', K.since, now, id)
  redis.call('HINCRBY', K.tenants, tenant, 1)
end

-- Drop the bookkeeping of an entry already taken out of queue. A tenant
-- left with no entry forgets its F_t: it comes back at V, with neither
-- credit nor a debt for entries it gave up.
local function forget(id)
  redis.call('ZREM', K.since, id)
  redis.call('HDEL', K.weights, id)
  local tenant = redis.call('HGET', K.waiters, id)
  if not tenant then return end
  redis.call('HDEL', K.waiters, id)
  if redis.call('HINCRBY', K.tenants, tenant, -1) <= 0 then
    redis.call('HDEL', K.tenants, tenant)
    redis.call('HDEL', K.finish, tenant)
  end
end

-- Remove id's queue entry, if any; returns 1 if there was one.
local function unqueue(id)
  local n = redis.call('ZREM', K.queue, id)
  if n == 1 then forget(id) end
  return n
end

-- Hand free permits to live waiters from the head of the queue, dropping
-- zombies on the way, and move V to the tag of the last entry granted.
-- Returns the ids granted, in queue order.
local function pump(limit, lease, alive_prefix, now)
  local granted = {}
  local free = limit - redis.call('ZCARD', K.permits)
  if free <= 0 then return granted end
  local v0 = vtime()
  local v = v0
  local budget = 1000
  while free > 0 and budget > 0 do
    budget = budget - 1
    local head = redis.call('ZPOPMIN', K.queue)
    if #head == 0 then break end
    local id, tag = head[1], tonumber(head[2])
    forget(id)
    if redis.call('DEL', alive_prefix .. id) == 1 then
      grant(id, now, lease)
      granted[#granted + 1] = id
      free = free - 1
      -- A restored entry may sit behind V; V never goes back.
      if tag > v then v = tag end
    end
  end
  if v ~= v0 then redis.call('HSET', K.stats, 'vtime', v) end
  return granted
end
