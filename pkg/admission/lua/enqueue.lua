-- Ask for a permit: grant it at once when one is free and nobody is ahead,
-- otherwise join (or keep) a place in the FIFO queue. Idempotent: calling it
-- again for the same id reports the current state, so it doubles as the
-- waiter's fallback re-check.
-- KEYS[1] permits  KEYS[2] grants  KEYS[3] queue  KEYS[4] seq  KEYS[5] stats
-- ARGV[1] request id
-- ARGV[2] default permit limit
-- ARGV[3] lease ms
-- ARGV[4] max queue depth
-- ARGV[5] waiter liveness ttl ms
-- ARGV[6] liveness key prefix
-- ARGV[7] arrival seq to restore (0 = new arrival): a waiter whose entry was
--         dropped as a zombie (e.g. all workers were down) gets its old place
-- ARGV[8] tombstone key prefix: a request that has released is never
--         admitted again, so a late or retried call cannot resurrect it
-- Returns {status, position, seq, limit, ewma_ms, woken ids...}
--   status 1 = holds a permit, 2 = queued at position (1-based), 3 = queue
--   full, 4 = the request already released (nothing was taken)
--   woken: other waiters granted a permit by this call; the caller must
--   notify them.
local permits, grants, queue, seqkey, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id = ARGV[1]
local lease = tonumber(ARGV[3])
local max_depth = tonumber(ARGV[4])
local alive_ttl = tonumber(ARGV[5])
local alive_prefix = ARGV[6]
local restore = tonumber(ARGV[7])

local now = now_ms()
local limit = pool_limit(stats, ARGV[2])
local ewma = tonumber(redis.call('HGET', stats, 'ewma_ms') or '0')
if redis.call('EXISTS', ARGV[8] .. id) == 1 then
  return {4, 0, 0, limit, ewma}
end
expire_permits(permits, grants, now)

if redis.call('ZSCORE', permits, id) then
  return {1, 0, restore, limit, ewma}
end

local seq = redis.call('ZSCORE', queue, id)
if seq then
  seq = tonumber(seq)
elseif restore > 0 then
  seq = restore
  redis.call('ZADD', queue, seq, id)
else
  if redis.call('ZCARD', queue) >= max_depth then
    return {3, 0, 0, limit, ewma}
  end
  seq = redis.call('INCR', seqkey)
  redis.call('ZADD', queue, seq, id)
end
redis.call('SET', alive_prefix .. id, '1', 'PX', alive_ttl)

local granted = pump(permits, grants, queue, alive_prefix, limit, lease, now)
local mine = false
local reply = {0, 0, seq, limit, ewma}
for _, g in ipairs(granted) do
  if g == id then mine = true else reply[#reply + 1] = g end
end
if mine then
  reply[1] = 1
else
  reply[1] = 2
  reply[2] = redis.call('ZRANK', queue, id) + 1
end
return reply
