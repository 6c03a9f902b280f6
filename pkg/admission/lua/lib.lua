-- Shared prelude, prepended to every admission script when it is loaded,
-- followed by order.lua (the fair order's verbs); the two are one chunk.
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
--   KEYS[15] deadlines HASH queued request id -> "<deadline ms>:<slo ms>":
--                          its arrival at the door (wall clock) plus its
--                          class's TTFT SLO, and that SLO; an entry
--                          without one has no deadline (by_deadline)
--   KEYS[16] ranks   HASH  queued request id -> its class rank (0: most
--                          urgent; request.ClassRank), when its class is
--                          known: a paused stream queues behind the
--                          entries of more urgent classes (yield.lua)
--   KEYS[17] clock   HASH  vtime: the group's virtual time V
--   KEYS[18] finish  HASH  tenant -> F_t, for the whole group
--   KEYS[19] credit  HASH  tenant -> ticks its released requests were
--                          charged beyond what they used (negative: short
--                          of it), taken off its next entries' lengths
--   KEYS[20] reserved HASH tenant -> "<count>:<expiry ms>": places in the
--                          fair order reserved at the door (reserve.lua)
--                          and not yet taken by an entry; the tenant keeps
--                          its F_t and credit while it has any
--   KEYS[21] shift   HASH  tenant -> ticks its streams have been charged
--                          since it was last idle (advance): a place
--                          reserved at the door notes it, and is taken
--                          that much later for what was charged since
--   KEYS[22…] the other pools of the group, 16 keys each in the order above
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
local NKEYS = 16
local function pool_keys(at)
  return {
    permits = KEYS[at], grants = KEYS[at + 1], queue = KEYS[at + 2], stats = KEYS[at + 3],
    tenants = KEYS[at + 4], finish = KEYS[at + 5], waiters = KEYS[at + 6], since = KEYS[at + 7],
    weights = KEYS[at + 8], order = KEYS[at + 9], heads = KEYS[at + 10], held = KEYS[at + 11],
    parked = KEYS[at + 12], charged = KEYS[at + 13], deadlines = KEYS[at + 14],
    ranks = KEYS[at + 15],
  }
end

-- K is the pool being worked on: the script's own, except while pump
-- grants in another pool of the group. Every helper below reads K.
local K = pool_keys(1)
local SELF = K
local G = {clock = KEYS[17], finish = KEYS[18], credit = KEYS[19], reserved = KEYS[20], shift = KEYS[21]}

-- The other pools of the group: keys, and (after group_args) name,
-- configured limit and liveness prefix.
local OTHERS = {}
do
  local at = 22
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
