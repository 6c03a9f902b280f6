-- A stream asked to pause (preempt.lua) gives its permit back and waits
-- again, without losing its turn: its request re-queues at the head of
-- the fair order (the first free tick at V, where the next grant is
-- taken), but behind every entry queued in its pool of a class more
-- urgent than its own: the permits freed next go to those waiters, not
-- back to it (each of them would otherwise pause another stream). It
-- keeps what its streaming was charged so far (pay as you go goes on
-- when it is granted again). The permit goes to the first entry of the
-- tenant of the waiter it was paused for, when that waiter is
-- still queued, its tenant below its cap and the entry alive; otherwise,
-- and for anything else free, to whoever pump grants. In a group of pools
-- sharing a budget the waiter may be queued in another pool of the group
-- (preempt.lua: the budget, not this pool's limit, held it back): the
-- permit then goes back to the budget and is granted there, if that pool
-- is still below its own limit; and the stream queues behind the more
-- urgent entries of every pool of the group, which the budget would
-- otherwise grant after it. The stream stops upstream before it calls
-- this, so the permit's sequence is free when it is handed on.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] request id
-- ARGV[2] default permit limit
-- ARGV[3] lease ms
-- ARGV[4] liveness key prefix
-- ARGV[5] waiter liveness ttl ms: the paused request is a waiter now, and
--         keeps its mark alive (Gate.KeepAlive) while it waits
-- ARGV[6] its weight, as its entry had (its tier's)
-- ARGV[7] cap on the permits its tenant holds in this pool (0 = none)
-- ARGV[8] the pool's pausable key (preempt.lua KEYS[6]), and
-- ARGV[9] its asked key (preempt.lua KEYS[7]): both carry the pool's hash
--         tag, like the liveness prefix
-- ARGV[10] its class rank (request.ClassRank; -1 = unknown: it queues at
--          the head, behind nothing)
-- ARGV[11…] the group's arguments (lib.lua group_args)
-- Returns {status, tag, granted pool, id pairs...}: status 1 = paused and
-- queued at tag, 2 = it was granted its permit straight back (nobody
-- else could take it), 0 = it held no permit (nothing done). The caller
-- must notify every granted request but itself.
local id = ARGV[1]
local lease, alive_prefix, alive_ttl = tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local weight, cap = ARGV[6], tonumber(ARGV[7])
local pausable, asked = ARGV[8], ARGV[9]
local rank = tonumber(ARGV[10]) or -1
group_args(11)

local now = now_ms()
local limit = pool_limit(ARGV[2])
local waiter = redis.call('HGET', asked, id)
redis.call('HDEL', asked, id)
redis.call('HDEL', pausable, id)
local v = redis.call('HGET', K.grants, id)
if not redis.call('ZSCORE', K.permits, id) or not v then return {0, 0} end
local _, tenant = split(v)
if not tenant then return {0, 0} end

-- The pool of the group whose queue holds the waiter, or nil.
local function pool_of(w)
  if redis.call('HEXISTS', SELF.waiters, w) == 1 then
    return {k = SELF, alive = alive_prefix, name = SELF_NAME, limit = limit}
  end
  for _, o in ipairs(OTHERS) do
    if redis.call('HEXISTS', o.k.waiters, w) == 1 then
      return {k = o.k, alive = o.alive, name = o.name, limit = limit_of(o)}
    end
  end
  return nil
end

-- The tag of the last entry queued in any pool of the group of a class
-- more urgent than rank, but except's.
local function last_more_urgent_in_group(except)
  local last
  for _, p in ipairs(group_keys()) do
    K = p
    local t = last_more_urgent(rank, except)
    if t and (last == nil or t > last) then last = t end
  end
  K = SELF
  return last
end

local charged = redis.call('HGET', K.charged, id)
-- Never 0, which Enqueue reads as a new arrival when it is restored.
local from = math.max(vtime(), 1)
-- Not behind the entry granted below in its place, which leaves.
local wp = waiter and pool_of(waiter)
local wtenant, wfirst
if wp then
  K = wp.k
  wtenant = redis.call('HGET', K.waiters, waiter)
  wfirst = wtenant and first_entries(wtenant, 1)[1]
  if wfirst and not below_cap(wtenant, cap_of(wfirst[1])) then wfirst = nil end
  K = SELF
end
local urgent = last_more_urgent_in_group(wfirst and wfirst[1])
if urgent and urgent >= from then from = urgent + 1 end
local tag = free_tick(from)
-- The entry first, so that its tenant is not idle when the permit goes.
-- A tag behind urgent entries may move its tenant's F_t on with it, as
-- any entry does: its tenant's next arrivals queue behind it.
add_entry(id, tenant, tag, now, weight, cap, false, rank)
if tag > tonumber(redis.call('HGET', G.finish, tenant) or '0') then redis.call('HSET', G.finish, tenant, tag) end
drop_permit(id)
if charged then redis.call('HSET', K.charged, id, charged) end
redis.call('SET', alive_prefix .. id, '1', 'PX', alive_ttl)

local reply = {1, tag}
-- The waiter's tenant's first entry, which is the waiter or one of its
-- tenant's that came before it: a tenant's entries are granted in order.
-- In another pool, only while that pool is below its own limit.
if wtenant and (wp.k == SELF or redis.call('ZCARD', wp.k.permits) < wp.limit) then
  K = wp.k
  local first = first_entries(wtenant, 1)[1]
  if first then waiter = first[1] end
  local wtag = first and first[2]
  if wtag and below_cap(wtenant, cap_of(waiter)) then
    if grant_entry(waiter, wtag, wtenant, wp.alive, now, lease) then
      reply[#reply + 1] = wp.name
      reply[#reply + 1] = waiter
      if wtag > vtime() then redis.call('HSET', G.clock, 'vtime', wtag) end
    end
    refresh(wtenant)
  end
  K = SELF
end
local granted = pump(limit, lease, alive_prefix, now)
for i = 1, #granted, 2 do
  if granted[i + 1] == id then
    reply[1] = 2
  else
    reply[#reply + 1] = granted[i]
    reply[#reply + 1] = granted[i + 1]
  end
end
return reply
