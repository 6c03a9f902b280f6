-- The fair order's verbs, the second half of the prelude every admission
-- script is loaded with (lib.lua first, which declares the keys, the
-- bookkeeping of entries and heads, and the rules these follow): what a
-- request is charged and when, placing an entry, taking it out, and
-- granting permits. Split from lib.lua so that each file reads on its
-- own; the two are one Lua chunk at run time.

-- A charged value (KEYS[14]): the ticks charged so far, the weight, and,
-- for an entry placed paying as it goes, the ticks it was charged at
-- placement (nil for one charged up front).
local function read_charged(v)
  local t, rest = split(v)
  local w, third = split(rest)
  local placed = third and tonumber(third)
  if placed and placed < 0 then placed = -placed else placed = nil end
  return tonumber(t), tonumber(w), placed
end

local function charged_value(t, w, placed)
  return t .. ':' .. w .. ':-' .. placed
end
-- The first tick at or after f that no queued entry holds. ZSET ties would
-- sort by request id; moving a newcomer past the entries already holding its
-- tag keeps equal tags in arrival order, at a cost of a tick each (1/2520 of
-- a unit).
-- In a group the tags of all its queues are distinct, so that the order
-- across pools, and a waiter's position in it, is total.
local function free_tick(f)
  while true do
    local last = f + 31
    local taken = {}
    for _, q in ipairs(queues()) do
      local in_q = redis.call('ZRANGEBYSCORE', q, f, last, 'WITHSCORES')
      for i = 2, #in_q, 2 do taken[#taken + 1] = tonumber(in_q[i]) end
    end
    if #OTHERS > 0 then table.sort(taken) end
    for _, s in ipairs(taken) do
      if s > f then return f end
      if s == f then f = f + 1 end
    end
    if f <= last then return f end
  end
end

-- Move tenant delta ticks later in the fair order, for tokens its
-- streams were served: its F_t, its shift (so that the places it reserved
-- at the door are taken that much later), and each of its entries queued
-- in the group's pools, in tag order, each to the first free tick at or
-- past both its moved tag and the one before it, so that its entries stay
-- in arrival order and tags stay distinct. Its waiting entries move with
-- its counter, as VTC orders a tenant's waiting requests by it. A tenant
-- without F_t (placed by scripts that dropped it while it held permits)
-- is charged from V.
local function advance(tenant, delta)
  local f = redis.call('HGET', G.finish, tenant)
  f = (f and tonumber(f) or vtime()) + delta
  redis.call('HINCRBY', G.shift, tenant, delta)
  local was = K
  for _, p in ipairs(group_keys()) do
    K = p
    if redis.call('HEXISTS', K.tenants, tenant) == 1 then
      local entries = first_entries(tenant, -1)
      for _, e in ipairs(entries) do
        redis.call('ZREM', K.queue, e[1])
        redis.call('ZREM', K.order, order_member(tenant, e[2], e[1]))
      end
      local prev = -1
      for _, e in ipairs(entries) do
        local tag = free_tick(math.max(e[2] + delta, prev + 1))
        redis.call('ZADD', K.queue, tag, e[1])
        redis.call('ZADD', K.order, 0, order_member(tenant, tag, e[1]))
        prev = tag
      end
      if prev > f then f = prev end
      refresh(tenant)
    end
  end
  K = was
  redis.call('HSET', G.finish, tenant, f)
end

-- Settle a released request of tenant that used used (its cost as
-- served) against what it was charged (charged, KEYS[14]): what it used
-- beyond that is charged now (advance), what it was charged beyond it is
-- the tenant's credit. The caller has given the request's permit back,
-- and drops what an idle tenant keeps (leave_if_idle).
local function settle(tenant, charged, used)
  local t, w = read_charged(charged)
  local diff = ticks(used, w) - t
  if diff > 0 then
    advance(tenant, diff)
  elseif diff < 0 then
    redis.call('HINCRBY', G.credit, tenant, -diff)
  end
end

-- Give back id's permit, if it holds one, and its tenant's count of
-- permits with it: exactly once, whoever calls (release, lease expiry).
-- Returns 1 and the grant time (ms, 0 if unknown) if it held one.
local function drop_permit(id, used)
  local charged = redis.call('HGET', K.charged, id)
  if charged then redis.call('HDEL', K.charged, id) end
  if redis.call('ZREM', K.permits, id) == 0 then return 0, 0 end
  local v = redis.call('HGET', K.grants, id)
  if not v then return 1, 0 end
  redis.call('HDEL', K.grants, id)
  local since, tenant = split(v)
  if tenant then
    if redis.call('HINCRBY', K.held, tenant, -1) <= 0 then
      redis.call('HDEL', K.held, tenant)
    end
    if charged and used and used > 0 then settle(tenant, charged, used) end
    leave_if_idle(tenant)
    -- Only a parked tenant can become grantable by giving one back.
    if redis.call('HEXISTS', K.parked, tenant) == 1 then refresh(tenant) end
  end
  return 1, tonumber(since)
end

-- Drop permits whose lease ran out (their holder crashed or stalled). The
-- time each was held, from its grant to its lease's end, is added to the
-- pool's stats field expired_held_ms, which pump.lua hands to its caller
-- once: no holder is left to account for it.
local function expire_permits(now)
  local dead = redis.call('ZRANGEBYSCORE', K.permits, '-inf', now, 'WITHSCORES')
  for i = 1, #dead, 2 do
    local _, since = drop_permit(dead[i])
    local expiry = tonumber(dead[i + 1])
    if since > 0 and expiry > since then
      redis.call('HINCRBY', K.stats, 'expired_held_ms', expiry - since)
    end
  end
end

-- Give id, of tenant, a permit, counted against the tenant. The caller
-- refreshes the tenant if it has entries queued.
local function grant(id, tenant, now, lease)
  if redis.call('ZADD', K.permits, now + lease, id) == 1 then
    redis.call('HINCRBY', K.held, tenant, 1)
  end
  redis.call('HSET', K.grants, id, now .. ':' .. tenant)
end

-- Whether tenant may take another permit under cap (0 = none).
local function below_cap(tenant, cap)
  return cap <= 0 or tonumber(redis.call('HGET', K.held, tenant) or '0') < cap
end

-- A new place in the fair order for a request of tenant: it starts at
-- max(V, F_t) and spans its charge in ticks (cost/weight: what is known
-- of the request when it queues; its output is charged as it streams),
-- shortened (or lengthened) by the tenant's credit (or debt) from
-- settled requests, down to one tick, what is left of the credit
-- staying. F_t moves to its tag. Returns the tag and the charge (ticks
-- before credit), which settle needs.
local function place(tenant, cost, weight)
  local start = math.max(vtime(), tonumber(redis.call('HGET', G.finish, tenant) or '0'))
  local charge = ticks(cost, weight)
  local length = charge
  local credit = tonumber(redis.call('HGET', G.credit, tenant) or '0')
  if credit ~= 0 then
    length = math.max(1, charge - credit)
    local left = credit - (charge - length)
    if left == 0 then redis.call('HDEL', G.credit, tenant) else redis.call('HSET', G.credit, tenant, left) end
  end
  local tag = free_tick(start + length)
  redis.call('HSET', G.finish, tenant, tag)
  return tag, charge
end

-- How many entries queued in the group's pools have tags below tag.
local function below(tag)
  local n = 0
  local upto = '(' .. string.format('%.0f', tag)
  for _, q in ipairs(queues()) do
    n = n + redis.call('ZCOUNT', q, '-inf', upto)
  end
  return n
end

-- Record a queue entry, count it against its tenant and place the tenant.
-- cap is its tier's cap on the permits its tenant holds (0 = none). newest:
-- the entry's tag is past the tenant's others (a new arrival), so that its
-- first entry, and whether the tenant may be granted, are as they were.
-- rank is its class rank (< 0: unknown), noted for yield.lua.
local function add_entry(id, tenant, tag, now, weight, cap, newest, rank)
  if rank and rank >= 0 then redis.call('HSET', K.ranks, id, rank) end
  redis.call('ZADD', K.queue, tag, id)
  redis.call('ZADD', K.order, 0, order_member(tenant, tag, id))
  redis.call('HSET', K.waiters, id, tenant)
  if cap > 0 then weight = weight .. ':' .. cap end
  redis.call('HSET', K.weights, id, weight)
  redis.call('ZADD', K.since, now, id)
  if redis.call('HINCRBY', K.tenants, tenant, 1) > 1 and newest then
    if redis.call('HEXISTS', K.parked, tenant) == 1 then
      redis.call('HINCRBY', K.parked, tenant, 1)
      redis.call('HINCRBY', K.stats, 'parked', 1)
    end
    return
  end
  refresh(tenant)
end

-- Each entry's deadline and SLO in KEYS[15] ("<ms>:<ms>"): none is
-- +infinity at SLO 0. Read a thousand at a time: unpack is bounded by
-- Lua's C stack, and a tenant may have more entries queued.
local function read_deadlines(ids)
  local dl, slo = {}, {}
  for from = 1, #ids, 1000 do
    local upto = math.min(from + 999, #ids)
    for j, v in ipairs(redis.call('HMGET', K.deadlines, unpack(ids, from, upto))) do
      local i = from + j - 1
      if v then
        local d, s = split(v)
        dl[i], slo[i] = tonumber(d), tonumber(s or '0')
      else
        dl[i], slo[i] = math.huge, 0
      end
    end
  end
  return dl, slo
end

-- Whether id is tenant's last entry in the pool, and the id of the entry
-- before it (nil when it is not last or has none).
local function last_entry(tenant, id)
  local p = order_prefix(tenant)
  local m = redis.call('ZREVRANGEBYLEX', K.order, '(' .. p .. '\255', '[' .. p, 'LIMIT', 0, 2)
  if m[1] == nil or string.sub(m[1], #p + 19) ~= id then return false, nil end
  return true, m[2] and string.sub(m[2], #p + 19)
end

-- Whether entry id stays where it is because it is its tenant's last and
-- the entry before it has its SLO, which it never passes (deadline_slot):
-- a tenant of one class then costs two reads an arrival, not a read of
-- all its entries.
local function stays_last(tenant, id, slo)
  local last, prev = last_entry(tenant, id)
  if not last or not prev then return last end
  local v = redis.call('HGET', K.deadlines, prev)
  local _, s = split(v or '')
  return tonumber(s or '0') == slo
end

-- Where entry at (an index into its tenant's entries in tag order) goes
-- when the tenant's own entries are served earliest deadline first:
-- before the first entry with a later deadline, but never past an entry
-- of its own SLO, whose order against it is already their arrival order.
-- Returns the index it goes before (#dl + 1: the end).
local function deadline_slot(at, dl, slo)
  local lo, hi = 1, #dl
  for i = at - 1, 1, -1 do
    if slo[i] == slo[at] then lo = i + 1 break end
  end
  for i = at + 1, #dl do
    if slo[i] == slo[at] then hi = i - 1 break end
  end
  for i = lo, hi do
    if i ~= at and dl[i] > dl[at] then return i end
  end
  return hi + 1
end

-- Note entry id's deadline (ms, 0: none) and its class's TTFT SLO (ms),
-- and serve its tenant's own entries in this pool earliest deadline
-- first, without moving the tenant in the fair order across tenants:
-- the tenant keeps the very tags it holds, which are its place among the
-- others, and which of its entries holds which is dealt again. id goes
-- before the first of its tenant's entries with a later deadline (an
-- entry without one has none: it keeps its arrival order behind those
-- with one), that entry takes the next one's tag, and so on, the last
-- taking id's own. Entries of one SLO keep their tag order, their order
-- of arrival, so a tenant of one class is served exactly as without
-- deadlines. An entry's charge (KEYS[14]) is its request's, whichever tag
-- it holds: its release settles what it used against what it was charged
-- (settle), so dealing tags moves no charge between requests. Returns
-- id's tag.
local function by_deadline(id, tenant, tag, deadline, slo)
  if deadline > 0 then
    redis.call('HSET', K.deadlines, id, string.format('%.0f', deadline) .. ':' .. string.format('%.0f', slo))
    if stays_last(tenant, id, slo) then return tag end
  elseif redis.call('HLEN', K.deadlines) == 0 or last_entry(tenant, id) then
    -- No deadline, and none to go behind, or at the end already.
    return tag
  end
  if tonumber(redis.call('HGET', K.tenants, tenant) or '0') < 2 then return tag end
  local entries = first_entries(tenant, -1)
  local ids, at = {}, 0
  for i, e in ipairs(entries) do
    ids[i] = e[1]
    if e[1] == id then at = i end
  end
  if at == 0 then return tag end
  local dl, cls = read_deadlines(ids)
  local slot = deadline_slot(at, dl, cls)
  local dealt = {}
  for i = 1, #entries do
    if i == slot then dealt[#dealt + 1] = entries[at] end
    if i ~= at then dealt[#dealt + 1] = entries[i] end
  end
  if slot > #entries then dealt[#dealt + 1] = entries[at] end
  local moved = {}
  for i, e in ipairs(dealt) do
    local to = entries[i][2]
    if e[2] ~= to then
      redis.call('ZREM', K.order, order_member(tenant, e[2], e[1]))
      moved[#moved + 1] = {e[1], to}
    end
    if e[1] == id then tag = to end
  end
  if #moved == 0 then return tag end
  for _, m in ipairs(moved) do
    redis.call('ZADD', K.queue, m[2], m[1])
    redis.call('ZADD', K.order, 0, order_member(tenant, m[2], m[1]))
  end
  refresh(tenant)
  return tag
end

-- The largest tag of an entry queued in this pool, other than except,
-- whose class is more urgent than rank (a smaller rank); nil when none
-- is. It reads the queue from its far end, 128 entries a read, and stops
-- at the first such entry, so it reads the entries queued behind the last
-- urgent one: under a backlog of less urgent work, which is when streams
-- are paused, most of the queue (bounded by admission.max_queue_depth).
-- Only a pause calls it (yield.lua), so that cost is per pause, not per
-- grant.
local function last_more_urgent(rank, except)
  if not rank or rank <= 0 or redis.call('HLEN', K.ranks) == 0 then return nil end
  local from = 0
  while true do
    local batch = redis.call('ZREVRANGE', K.queue, from, from + 127, 'WITHSCORES')
    if #batch == 0 then return nil end
    local ids = {}
    for i = 1, #batch, 2 do ids[#ids + 1] = batch[i] end
    for j, r in ipairs(redis.call('HMGET', K.ranks, unpack(ids))) do
      if r and tonumber(r) < rank and ids[j] ~= except then return tonumber(batch[2 * j]) end
    end
    from = from + 128
  end
end

-- Drop the bookkeeping of entry id, queued at tag, and return its tenant
-- (nil if it had none); tenant, if the caller knows it, saves a read. The
-- caller refreshes the tenant, and lets it go if it is left idle
-- (leave_if_idle; not when the entry is granted).
local function take(id, tag, tenant)
  redis.call('ZREM', K.queue, id)
  redis.call('ZREM', K.since, id)
  redis.call('HDEL', K.weights, id)
  redis.call('HDEL', K.deadlines, id)
  redis.call('HDEL', K.ranks, id)
  tenant = tenant or redis.call('HGET', K.waiters, id)
  if not tenant then return nil end
  redis.call('HDEL', K.waiters, id)
  redis.call('ZREM', K.order, order_member(tenant, tag, id))
  if redis.call('HINCRBY', K.tenants, tenant, -1) <= 0 then
    redis.call('HDEL', K.tenants, tenant)
  end
  return tenant
end

-- Take tenant's entry id, queued at tag in K's pool, and grant it a permit,
-- unless its waiter is gone (its liveness mark, under alive, lapsed: a
-- zombie), which only leaves. Returns whether it was granted. The caller
-- refreshes the tenant.
local function grant_entry(id, tag, tenant, alive, now, lease)
  take(id, tag, tenant)
  if redis.call('DEL', alive .. id) == 0 then
    redis.call('HDEL', K.charged, id)
    leave_if_idle(tenant)
    return false
  end
  grant(id, tenant, now, lease)
  return true
end

-- Remove id's queue entry, if any; returns 1 if there was one.
local function unqueue(id)
  local tag = redis.call('ZSCORE', K.queue, id)
  if not tag then return 0 end
  redis.call('HDEL', K.charged, id)
  local tenant = take(id, tonumber(tag))
  if tenant then
    refresh(tenant)
    leave_if_idle(tenant)
  end
  return 1
end

-- Whether a newcomer to SELF must queue for the group's sake: the group
-- budget is spent, or another pool has a waiter it could grant now (below
-- that pool's limit), who comes first. Never, for a pool alone.
local function group_contended(now)
  if #OTHERS == 0 then return false end
  local used = redis.call('ZCARD', SELF.permits)
  for _, o in ipairs(OTHERS) do
    K = o.k
    expire_permits(now)
    local held = redis.call('ZCARD', o.k.permits)
    used = used + held
    if redis.call('ZCARD', o.k.heads) > 0 and held < limit_of(o) then
      K = SELF
      return true
    end
  end
  K = SELF
  return GROUP_LIMIT > 0 and used >= GROUP_LIMIT
end

-- How many entries of the group's other pools are queued ahead of tag.
local function ahead_elsewhere(tag)
  local n = 0
  for _, o in ipairs(OTHERS) do
    n = n + redis.call('ZCOUNT', o.k.queue, '-inf', '(' .. string.format('%.0f', tag))
  end
  return n
end

-- Hand free permits to live waiters, smallest tag first among the tenants
-- below their caps, dropping zombies on the way, and move V to the tag of
-- the last entry granted. Tenants at their caps are not in heads, so
-- passing them by costs nothing; budget bounds the grants and drops of one
-- call. In a group, each grant goes to the smallest head among the pools
-- below their own limits while the group budget has a permit free; the
-- other pools' expired permits are reclaimed first. Returns the grants as
-- pool name, id pairs, in grant order.
local function pump(limit, lease, alive_prefix, now)
  local granted = {}
  local pools = {{k = SELF, limit = limit, alive = alive_prefix, name = SELF_NAME}}
  for _, o in ipairs(OTHERS) do
    K = o.k
    expire_permits(now)
    pools[#pools + 1] = {k = o.k, limit = limit_of(o), alive = o.alive, name = o.name}
  end
  local room = 0
  for _, p in ipairs(pools) do
    p.free = p.limit - redis.call('ZCARD', p.k.permits)
    if p.free > 0 then room = room + p.free end
    K = p.k
    if redis.call('HGET', K.stats, 'layout') ~= '2' then migrate() end
  end
  K = SELF
  if GROUP_LIMIT > 0 then
    local used = 0
    for _, p in ipairs(pools) do used = used + redis.call('ZCARD', p.k.permits) end
    room = math.min(room, GROUP_LIMIT - used)
  end
  if room <= 0 then return granted end
  local v0 = vtime()
  local v = v0
  local budget = 1000
  while room > 0 and budget > 0 do
    budget = budget - 1
    local best, best_tag, tenant
    for _, p in ipairs(pools) do
      if p.free > 0 then
        local h = redis.call('ZRANGE', p.k.heads, 0, 0, 'WITHSCORES')
        if #h == 2 and (best == nil or tonumber(h[2]) < best_tag) then
          best, best_tag, tenant = p, tonumber(h[2]), h[1]
        end
      end
    end
    if not best then break end
    K = best.k
    -- The entry to grant and the one that becomes the tenant's first.
    local two = first_entries(tenant, 2)
    if two[1] then
      local id, tag = two[1][1], two[1][2]
      if grant_entry(id, tag, tenant, best.alive, now, lease) then
        granted[#granted + 1] = best.name
        granted[#granted + 1] = id
        best.free = best.free - 1
        room = room - 1
        -- A restored entry, or one its tenant's cap held back, may sit
        -- behind V; V never goes back.
        if tag > v then v = tag end
      end
    end
    refresh(tenant, two[2] or false)
    K = SELF
  end
  if v ~= v0 then redis.call('HSET', G.clock, 'vtime', v) end
  return granted
end
