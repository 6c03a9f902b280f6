-- Give back whatever a request holds in this pool: its permit, or its place
-- in the queue. Idempotent, so a retried release cannot free a slot twice.
-- A freed permit is handed straight to the next live waiter.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] request id
-- ARGV[2] default permit limit
-- ARGV[3] lease ms
-- ARGV[4] liveness key prefix
-- ARGV[5] EWMA weight of the newest hold time, e.g. 0.2
-- ARGV[6] tombstone key prefix
-- ARGV[7] tombstone ttl ms: how long enqueue refuses this request id
-- ARGV[8] the cost the request used (0: unknown), settled against what
--         it was charged (order.lua settle)
-- ARGV[9…] the group's arguments (lib.lua group_args)
-- Returns {held_permit (0/1), was_queued (0/1), ms the permit was held
--          (0: none, or its grant time unknown), woken pool, id pairs...}
local id = ARGV[1]
local lease = tonumber(ARGV[3])
local alive_prefix = ARGV[4]
local alpha = tonumber(ARGV[5])
local used = tonumber(ARGV[8])
group_args(9)

local now = now_ms()
local limit = pool_limit(ARGV[2])
expire_permits(now)

local held, since = drop_permit(id, used)
local hold = 0
if held == 1 and since > 0 and now >= since then
  local ewma = tonumber(redis.call('HGET', K.stats, 'ewma_ms') or '0')
  hold = now - since
  if ewma == 0 then ewma = hold else ewma = ewma + alpha * (hold - ewma) end
  redis.call('HSET', K.stats, 'ewma_ms', math.floor(ewma + 0.5))
end
if held == 0 then redis.call('HDEL', K.grants, id) end
local queued = unqueue(id)
redis.call('DEL', alive_prefix .. id)
-- A shed request's tombstone keeps saying so when its workflow releases.
local tomb = ARGV[6] .. id
if redis.call('GET', tomb) == 'shed' then
  redis.call('SET', tomb, 'shed', 'PX', tonumber(ARGV[7]))
else
  redis.call('SET', tomb, '1', 'PX', tonumber(ARGV[7]))
end

local reply = {held, queued, hold}
for _, g in ipairs(pump(limit, lease, alive_prefix, now)) do
  reply[#reply + 1] = g
end
return reply
