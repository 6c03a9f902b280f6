-- Ask for a permit: grant it at once when one is free, nobody waits who
-- could take it and the tenant is below its cap, otherwise join (or keep) a
-- place in the weighted fair queue. Idempotent: calling it again for the
-- same id reports the current state, so it doubles as the waiter's
-- fallback re-check.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1]  request id
-- ARGV[2]  tenant
-- ARGV[3]  weight (> 0): the tenant's share
-- ARGV[4]  cost (> 0): the request's size; its entry spans cost/weight
-- ARGV[5]  cap on the tenant's entries in this queue (0 = none)
-- ARGV[6]  finish tag to restore (0 = new arrival): a waiter whose entry was
--          dropped as a zombie (e.g. all workers were down) gets its old
--          place back, past both caps, as it had been admitted to the queue
-- ARGV[7]  default permit limit
-- ARGV[8]  lease ms
-- ARGV[9]  max queue depth of the pool
-- ARGV[10] waiter liveness ttl ms
-- ARGV[11] liveness key prefix
-- ARGV[12] tombstone key prefix: a request that has released (or was shed)
--          is never admitted again, so a late or retried call cannot
--          resurrect it
-- ARGV[13] cap on the permits the tenant holds in this pool at once (0 =
--          none): while the tenant holds that many, its entries wait at
--          their places and others are granted past them
-- ARGV[14] a tag reserved at the door for this request (reserve.lua; 0 =
--          none): a new arrival takes it as its place instead of a new
--          one, and gives its tenant's reservation back whatever the answer
-- ARGV[15] the ticks that place was charged (reserve.lua; 0 = unknown, a
--          place reserved before they were returned: its cost/weight)
-- ARGV[16] the tenant's shift when that place was reserved (reserve.lua):
--          the place is taken as much later as the tenant's streams were
--          charged since (order.lua advance); a place reserved before
--          shifts were kept passes 0, and moves by all of the shift:
--          later than it should, never earlier
-- ARGV[17] the request's deadline, ms of the wall clock (0 = none): its
--          arrival at the door plus its class's TTFT SLO; its tenant's
--          own entries are served earliest deadline first (by_deadline)
-- ARGV[18] that TTFT SLO, ms: entries of one SLO keep their arrival order
-- ARGV[19] its class rank (request.ClassRank; -1 = unknown): a paused
--          stream queues behind the entries of more urgent classes
-- ARGV[20…] the group's arguments (lib.lua group_args)
-- Returns {status, position, tag, limit, ewma_ms, woken pool, id pairs...}
--   status 1 = holds a permit, 2 = queued at position (1-based), 3 = pool
--   queue full, 4 = the request already released (nothing was taken),
--   5 = the tenant's queue is full, 6 = the request was shed (shed.lua):
--   like 4, but the request was turned away rather than gone by itself
--   position counts the entries ahead in every pool of the group
--   tag: the entry's finish tag, the restore token (0 when granted at once)
--   woken: other waiters granted a permit by this call; the caller must
--   notify them.
local id, tenant = ARGV[1], ARGV[2]
local weight, cost = tonumber(ARGV[3]), tonumber(ARGV[4])
local tenant_cap, restore = tonumber(ARGV[5]), tonumber(ARGV[6])
local lease = tonumber(ARGV[8])
local max_depth = tonumber(ARGV[9])
local alive_ttl = tonumber(ARGV[10])
local alive_prefix = ARGV[11]
local held_cap = tonumber(ARGV[13])
local reserved_tag = tonumber(ARGV[14])
local reserved_charge = tonumber(ARGV[15])
local reserved_shift = tonumber(ARGV[16])
local deadline, slo = tonumber(ARGV[17]) or 0, tonumber(ARGV[18]) or 0
local rank = tonumber(ARGV[19]) or -1
group_args(20)

local now = now_ms()
local limit = pool_limit(ARGV[7])
local ewma = tonumber(redis.call('HGET', K.stats, 'ewma_ms') or '0')
local tomb = redis.call('GET', ARGV[12] .. id)
if tomb == 'shed' then
  return {6, 0, 0, limit, ewma}
elseif tomb then
  return {4, 0, 0, limit, ewma}
end
expire_permits(now)

if redis.call('ZSCORE', K.permits, id) then
  return {1, 0, restore, limit, ewma}
end

local tag = redis.call('ZSCORE', K.queue, id)
if tag then
  tag = tonumber(tag)
elseif restore > 0 then
  tag = restore
  add_entry(id, tenant, tag, now, weight, held_cap, false, rank)
  local last = tonumber(redis.call('HGET', G.finish, tenant) or '0')
  if tag > last then redis.call('HSET', G.finish, tenant, tag) end
  -- A Redis that restarted empty starts V again at 0 while the waiters
  -- coming back hold tags of the old clock: V moves up to where the
  -- restored entry started, so that newcomers queue behind the waiters
  -- that were there before them.
  local start = tag - ticks(cost, weight)
  if vtime() < start then redis.call('HSET', G.clock, 'vtime', start) end
  tag = by_deadline(id, tenant, tag, deadline, slo)
else
  -- A new arrival: the door's reservation, if it made one, is taken now,
  -- whatever the answer.
  if reserved_tag > 0 then reserve_count(tenant, -1) end
  if redis.call('ZCARD', K.heads) == 0 and redis.call('ZCARD', K.permits) < limit
      and redis.call('HEXISTS', K.tenants, tenant) == 0 and below_cap(tenant, held_cap)
      and not group_contended(now) then
    -- Nobody to be fair to (whoever waits is held back by a cap, and none
    -- of them is this tenant's): the request never waits, so it takes no
    -- tag and leaves V alone.
    grant(id, tenant, now, lease)
    return {1, 0, 0, limit, ewma}
  end
  if redis.call('ZCARD', K.queue) >= max_depth then
    return {3, 0, 0, limit, ewma}
  end
  if tenant_cap > 0 and tonumber(redis.call('HGET', K.tenants, tenant) or '0') >= tenant_cap then
    return {5, 0, 0, limit, ewma}
  end
  local charge
  if reserved_tag > 0 then
    -- Its place was taken in the fair order when it arrived at the door
    -- (F_t moved then, its credit was spent then), and has moved with
    -- its tenant's charges since.
    tag, charge = reserved_tag, reserved_charge
    if charge <= 0 then charge = ticks(cost, weight) end
    local moved = tonumber(redis.call('HGET', G.shift, tenant) or '0') - reserved_shift
    if moved > 0 then
      tag = free_tick(tag + moved)
      if tag > tonumber(redis.call('HGET', G.finish, tenant) or '0') then redis.call('HSET', G.finish, tenant, tag) end
    end
    add_entry(id, tenant, tag, now, weight, held_cap, false, rank)
  else
    tag, charge = place(tenant, cost, weight)
    add_entry(id, tenant, tag, now, weight, held_cap, true, rank)
  end
  tag = by_deadline(id, tenant, tag, deadline, slo)
  redis.call('HSET', K.charged, id, charged_value(charge, weight, charge))
end
redis.call('SET', alive_prefix .. id, '1', 'PX', alive_ttl)

local granted = pump(limit, lease, alive_prefix, now)
local mine = false
local reply = {0, 0, tag, limit, ewma}
for _, g in ipairs(granted) do
  if g == id then mine = true else reply[#reply + 1] = g end
end
if mine then
  reply[1] = 1
else
  reply[1] = 2
  reply[2] = redis.call('ZRANK', K.queue, id) + 1 + ahead_elsewhere(tag)
end
return reply
