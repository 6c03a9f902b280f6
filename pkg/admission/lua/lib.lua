-- Shared prelude, prepended to every admission script when it is loaded.
-- Every script gets the pool's keys in this order (renew only the first two),
-- then its group's (below); all share the group's hash tag:
--   KEYS[1]  permits ZSET  request id -> lease expiry (ms, Redis clock)
--   KEYS[2]  grants  HASH  request id -> "<grant time ms>:<tenant>", to
--                          measure hold time and give the tenant's count
--                          back (permits granted before tenants were
--                          counted have the time alone)
--   KEYS[3]  queue   ZSET  request id -> finish tag F (virtual-time ticks);
--                          the head is the smallest tag
--   KEYS[4]  stats   HASH  limit (optional override), ewma_ms (mean permit
--                          hold time), vtime (the pool's virtual time V),
--                          parked (entries held back by their tenant's
--                          cap), layout (2 once order and heads are built),
--                          expired_held_ms (hold time of expired permits
--                          not yet claimed by a pump)
--   KEYS[5]  tenants HASH  tenant -> its entries in queue
--   KEYS[6]  finish  HASH  tenant -> F of its last entry (F_t); dropped when
--                          the tenant has no entry left
--   KEYS[7]  waiters HASH  queued request id -> its tenant
--   KEYS[8]  since   ZSET  queued request id -> enqueue time (ms)
--   KEYS[9]  weights HASH  queued request id -> its weight (its tier's),
--                          for shedding the lowest tier, and ":<cap>" when
--                          its tier caps the permits its tenant holds;
--                          entries queued before it existed have none and
--                          are never shed
--   KEYS[10] order   ZSET  every queued entry as "<len>:<tenant>:<tag>:<id>"
--                          at score 0: each tenant's entries in tag order,
--                          read by lex range
--   KEYS[11] heads   ZSET  tenant -> tag of its first entry, for the tenants
--                          with entries that may be granted one now (below
--                          their cap): the next grant is the smallest
--   KEYS[12] held    HASH  tenant -> permits it holds
--   KEYS[13] parked  HASH  tenant -> its entries, while its first entry is
--                          held back by its cap
--   KEYS[14] charged HASH  request id -> what its entry has advanced its
--                          tenant's F_t by so far, until its release
--                          settles it against what it used:
--                          "<ticks>:<weight>:-<ticks at placement>" for an
--                          entry placed paying as it goes (charge.lua adds
--                          its output as it streams; the negative third
--                          field marks it), "<ticks>:<weight>[:<bound>]"
--                          for one charged up front (by scripts before pay
--                          as you go), which charge.lua leaves alone
--   KEYS[15] clock   HASH  vtime: the group's virtual time V
--   KEYS[16] finish  HASH  tenant -> F_t, for the whole group
--   KEYS[17] credit  HASH  tenant -> ticks its released requests were
--                          charged beyond what they used (negative: short
--                          of it), taken off its next entries' lengths
--   KEYS[18] reserved HASH tenant -> "<count>:<expiry ms>": places in the
--                          fair order reserved at the door (reserve.lua)
--                          and not yet taken by an entry; the tenant keeps
--                          its F_t and credit while it has any
--   KEYS[19] shift   HASH  tenant -> ticks its streams have been charged
--                          since it was last idle (advance): a place
--                          reserved at the door notes it, and is taken
--                          that much later for what was charged since
--   KEYS[20…] the other pools of the group, 14 keys each in the order above
-- A pool alone is a group of one: its clock and finish are its own stats
-- and finish keys (KEYS[4], KEYS[6]), and no other pool follows.
--
-- A tenant pays as it goes, as VTC counts: an entry is charged what is
-- known when it queues, its request's prompt (its bound: the caller's
-- cost leaves the output out), and its stream is charged its output
-- tokens as they come (charge.lua, every keep-alive tick of the stream),
-- which advances the tenant's F_t and moves its queued entries and its
-- places reserved at the door that much later (advance). Its release
-- settles what the request used against what it was charged: what is
-- left over is charged the same way, an overcharge (the prompt's bound
-- is above the prompt) is the tenant's credit, taken off its next
-- entries. So a tenant that asks max_tokens 1024 for answers of 200
-- pays for 200, and pays for them while they stream, not at release,
-- when its next requests have taken their places. A tenant keeps F_t,
-- shift and credit while it has entries queued, requests in flight or
-- places reserved; when it goes idle it comes back at V, keeping as a
-- debt only what its streams ran its F_t ahead of V (leave_if_idle), as
-- VTC keeps a counter that ran ahead, so a tenant cannot shed what it
-- used by pausing.
--
-- Pools that share backends are one group (pools.shared): one virtual
-- clock, one F_t per tenant and one permit budget, the group limit, so a
-- tenant's weighted share of the servers' tokens holds whichever pool its
-- prompts route to. Each pool keeps its own queue, heads and permits, and
-- its limit caps what it may hold of the budget: a pool's unused permits
-- are lent to the other up to that cap, and what its cap leaves over is
-- the other's reserve. A grant goes to the smallest head tag among the
-- pools below their caps. Scripts that pump get the group's pool names
-- and limits in ARGV (group_args).
--
-- and, by prefix, alive:<id> (waiter liveness mark with a TTL; an entry
-- whose mark expired belongs to a dead waiter, a zombie, and is skipped) and
-- released:<id> (tombstone of a request that gave back what it held). The
-- prefixes carry the pool's hash tag too, so on Redis Cluster the keys a
-- script builds from them are in the slot of its declared keys.
--
-- Ordering is self-clocked fair queuing. A new entry of tenant t starts at
-- S = max(V, F_t) and finishes at F = S + cost/weight; V moves to the tag of
-- each entry granted from the queue. So one tenant's entries are in arrival
-- order, backlogged tenants share grants in proportion to their weights, an
-- idle tenant comes back at V without banked credit, and a burst of one
-- tenant spreads its entries into the future instead of in front of others.
--
-- A tenant at its concurrency cap (it holds as many permits as its first
-- entry's tier allows) leaves heads, so grants pass it by at no cost while
-- its entries keep their tags; when it gives a permit back its first entry,
-- whose tag is now the smallest or near it, is granted next. Every change
-- to a tenant's entries or permits ends with refresh(tenant), which keeps
-- heads and parked true to the other keys.
local NKEYS = 14
local function pool_keys(at)
  return {
    permits = KEYS[at], grants = KEYS[at + 1], queue = KEYS[at + 2], stats = KEYS[at + 3],
    tenants = KEYS[at + 4], finish = KEYS[at + 5], waiters = KEYS[at + 6], since = KEYS[at + 7],
    weights = KEYS[at + 8], order = KEYS[at + 9], heads = KEYS[at + 10], held = KEYS[at + 11],
    parked = KEYS[at + 12], charged = KEYS[at + 13],
  }
end

-- K is the pool being worked on: the script's own, except while pump
-- grants in another pool of the group. Every helper below reads K.
local K = pool_keys(1)
local SELF = K
local G = {clock = KEYS[15], finish = KEYS[16], credit = KEYS[17], reserved = KEYS[18], shift = KEYS[19]}

-- The other pools of the group: keys, and (after group_args) name,
-- configured limit and liveness prefix.
local OTHERS = {}
do
  local at = 20
  while KEYS[at] do
    OTHERS[#OTHERS + 1] = {k = pool_keys(at)}
    at = at + NKEYS
  end
end

-- The group's arguments, from ARGV[at] on: this pool's name, the group
-- limit (0: none, a pool alone), then name, configured limit and liveness
-- prefix of each other pool, in KEYS order.
local SELF_NAME, GROUP_LIMIT = '', 0
local function group_args(at)
  SELF_NAME = ARGV[at]
  GROUP_LIMIT = tonumber(ARGV[at + 1] or '0')
  for i, o in ipairs(OTHERS) do
    local j = at + 2 + (i - 1) * 3
    o.name, o.default, o.alive = ARGV[j], ARGV[j + 1], ARGV[j + 2]
  end
end

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

-- Another pool's effective limit.
local function limit_of(o)
  local v = redis.call('HGET', o.k.stats, 'limit')
  if v then return tonumber(v) end
  return tonumber(o.default)
end

local function vtime()
  return tonumber(redis.call('HGET', G.clock, 'vtime') or '0')
end

-- The queue keys of every pool of the group.
local function queues()
  local out = {SELF.queue}
  for _, o in ipairs(OTHERS) do out[#out + 1] = o.k.queue end
  return out
end

-- A tenant's entries in order: the length prefix makes the tenant part
-- unambiguous whatever its name holds, and the zero-padded tag sorts as a
-- number (tags are integers below 2^53, 16 digits).
local function order_prefix(tenant)
  return #tenant .. ':' .. tenant .. ':'
end

local function order_member(tenant, tag, id)
  return order_prefix(tenant) .. string.format('%017.0f', tag) .. ':' .. id
end

-- The tenant's first n entries, each {id, tag}, in order.
local function first_entries(tenant, n)
  local p = order_prefix(tenant)
  local out = {}
  for i, m in ipairs(redis.call('ZRANGEBYLEX', K.order, '[' .. p, '(' .. p .. '\255', 'LIMIT', 0, n)) do
    local rest = string.sub(m, #p + 1)
    out[i] = {string.sub(rest, 19), tonumber(string.sub(rest, 1, 17))}
  end
  return out
end

-- The text before and after the first ':' of v ("3:2" -> "3", "2"; "3" ->
-- "3", nil).
local function split(v)
  local at = string.find(v, ':', 1, true)
  if not at then return v, nil end
  return string.sub(v, 1, at - 1), string.sub(v, at + 1)
end

-- The cap on the permits its tenant holds that queued entry id carries
-- (0: none).
local function cap_of(id)
  local v = redis.call('HGET', K.weights, id)
  if not v then return 0 end
  local _, cap = split(v)
  return tonumber(cap or '0')
end

-- Set tenant's parked count (0 drops it), keeping the stats total.
local function set_parked(tenant, n)
  local was = tonumber(redis.call('HGET', K.parked, tenant) or '0')
  if n == was then return end
  if n == 0 then
    redis.call('HDEL', K.parked, tenant)
  else
    redis.call('HSET', K.parked, tenant, n)
  end
  redis.call('HINCRBY', K.stats, 'parked', n - was)
end

-- Make heads and parked say the truth about tenant: in heads at its first
-- entry's tag when it has one and holds fewer permits than that entry's cap;
-- parked (with its entry count) when the cap holds it back. A tenant that
-- stays in heads was not parked, so the common case reads parked not at all.
-- first, if the caller knows it, is the tenant's first entry ({id, tag}, or
-- false for none).
local function refresh(tenant, first)
  if first == nil then first = first_entries(tenant, 1)[1] or false end
  local id, tag
  if first then id, tag = first[1], first[2] end
  if id then
    local cap = cap_of(id)
    if cap > 0 and tonumber(redis.call('HGET', K.held, tenant) or '0') >= cap then
      redis.call('ZREM', K.heads, tenant)
      set_parked(tenant, tonumber(redis.call('HGET', K.tenants, tenant) or '1'))
    elseif redis.call('ZADD', K.heads, tag, tenant) == 1 then
      set_parked(tenant, 0)
    end
  elseif redis.call('ZREM', K.heads, tenant) == 0 then
    set_parked(tenant, 0)
  end
end

-- Queues from before heads existed have entries without an order member;
-- build them, a bounded batch per call, so that no waiter of an upgrade is
-- stranded. A fresh pool is marked done at once. pump calls it before it
-- grants.
local function migrate()
  local from = redis.call('HGET', K.stats, 'migrated') or '-inf'
  local batch = redis.call('ZRANGEBYSCORE', K.queue, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 200)
  local touched, seen = {}, {}
  for i = 1, #batch, 2 do
    local id = batch[i]
    local tenant = redis.call('HGET', K.waiters, id)
    if tenant then
      redis.call('ZADD', K.order, 0, order_member(tenant, tonumber(batch[i + 1]), id))
      if not seen[tenant] then
        seen[tenant] = true
        touched[#touched + 1] = tenant
      end
    end
    from = batch[i + 1]
  end
  for _, tenant in ipairs(touched) do refresh(tenant) end
  if #batch < 400 then
    redis.call('HSET', K.stats, 'layout', '2')
    redis.call('HDEL', K.stats, 'migrated')
  else
    redis.call('HSET', K.stats, 'migrated', from)
  end
end

-- cost/weight in ticks, rounded.
local function span(cost, weight)
  return math.floor(cost * TICKS / weight + 0.5)
end

-- The length of an entry in ticks: cost/weight, at least one tick.
local function ticks(cost, weight)
  return math.max(1, span(cost, weight))
end

-- The group's pools: SELF and the others' keys.
local function group_keys()
  local out = {SELF}
  for _, o in ipairs(OTHERS) do out[#out + 1] = o.k end
  return out
end

-- The places tenant has reserved at the door and not yet taken, when they
-- lapse (ms), and whether a count is stored that has lapsed: 0, 0 once
-- their expiry passed (a door that died never gives them back).
local function read_reserved(tenant)
  local v = redis.call('HGET', G.reserved, tenant)
  if not v then return 0, 0, false end
  local n, expiry = split(v)
  n, expiry = tonumber(n), tonumber(expiry or '0')
  if expiry < now_ms() or n <= 0 then return 0, 0, true end
  return n, expiry, false
end

-- The places tenant has reserved, dropping a lapsed count.
local function reserved(tenant)
  local n, _, lapsed = read_reserved(tenant)
  if lapsed then redis.call('HDEL', G.reserved, tenant) end
  return n
end

-- Count a reservation of tenant's, kept at least ttl ms (by > 0), or give
-- one back (by < 0).
local function reserve_count(tenant, by, ttl)
  local n, expiry = read_reserved(tenant)
  n = n + by
  if n <= 0 then
    redis.call('HDEL', G.reserved, tenant)
    return
  end
  if ttl then expiry = math.max(expiry, now_ms() + ttl) end
  redis.call('HSET', G.reserved, tenant, n .. ':' .. expiry)
end

-- Whether tenant has neither an entry queued, a permit held nor a place
-- reserved anywhere in the group: idle, it keeps no credit (and no F_t).
local function idle(tenant)
  if reserved(tenant) > 0 then return false end
  for _, p in ipairs(group_keys()) do
    if redis.call('HEXISTS', p.tenants, tenant) == 1 or redis.call('HEXISTS', p.held, tenant) == 1 then
      return false
    end
  end
  return true
end

-- An idle tenant's credit goes (no banked credit); a debt stays, to be
-- paid by its next entries.
local function forget_credit(tenant)
  if tonumber(redis.call('HGET', G.credit, tenant) or '0') > 0 then
    redis.call('HDEL', G.credit, tenant)
  end
end

-- A tenant with nothing left in the group (idle) forgets its F_t, shift
-- and credit, and comes back at V. What its F_t ran ahead of V stays as
-- a debt, but no more than its streams were charged (shift): the output
-- it was served is owed, the entries it gave up are not.
local function leave_if_idle(tenant)
  if not idle(tenant) then return end
  local f = redis.call('HGET', G.finish, tenant)
  local moved = tonumber(redis.call('HGET', G.shift, tenant) or '0')
  if f and moved > 0 then
    local owed = math.min(tonumber(f) - vtime(), moved)
    if owed > 0 then redis.call('HINCRBY', G.credit, tenant, -owed) end
  end
  redis.call('HDEL', G.finish, tenant)
  redis.call('HDEL', G.shift, tenant)
  forget_credit(tenant)
end

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
local function add_entry(id, tenant, tag, now, weight, cap, newest)
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

-- Drop the bookkeeping of entry id, queued at tag, and return its tenant
-- (nil if it had none); tenant, if the caller knows it, saves a read. The
-- caller refreshes the tenant, and lets it go if it is left idle
-- (leave_if_idle; not when the entry is granted).
local function take(id, tag, tenant)
  redis.call('ZREM', K.queue, id)
  redis.call('ZREM', K.since, id)
  redis.call('HDEL', K.weights, id)
  tenant = tenant or redis.call('HGET', K.waiters, id)
  if not tenant then return nil end
  redis.call('HDEL', K.waiters, id)
  redis.call('ZREM', K.order, order_member(tenant, tag, id))
  if redis.call('HINCRBY', K.tenants, tenant, -1) <= 0 then
    redis.call('HDEL', K.tenants, tenant)
  end
  return tenant
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
      take(id, tag, tenant)
      if redis.call('DEL', best.alive .. id) == 0 then
        redis.call('HDEL', K.charged, id)
        leave_if_idle(tenant)
      else
        grant(id, tenant, now, lease)
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
