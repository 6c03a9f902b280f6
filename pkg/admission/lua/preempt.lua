-- Choose a stream to pause for an urgent waiter (preemption by
-- continuation), and record the request for the victim, whose keep-alive
-- reads it (pausable.lua) and acts on it (yield.lua). Standalone: no
-- lib.lua prelude.
-- A victim holds a permit of the pool and has said it can be paused
-- (pausable.lua: only a stream whose pool's backend can continue an
-- answer says so): it is of a class strictly less urgent than the
-- waiter's, has streamed at least min tokens since it (re)started, was
-- paused fewer than max times, and is not asked already. The least
-- urgent class goes first, then the stream running longest since its
-- last (re)start, then the smallest id, so the choice is deterministic.
-- Only a waiter whose tenant a free permit could go to now asks (its
-- tenant in heads: not held back by its cap), and only when the pool has
-- no permit free; a waiter that has a victim asked already gets that one
-- again, so a waiter pauses one stream at a time however often it asks.
-- The permit goes to its tenant's first entry (yield.lua), so a tenant's
-- urgent waiters, each pausing one stream, are granted in their order.
-- KEYS[1] permits  ZSET  request id -> lease expiry (lib.lua)
-- KEYS[2] stats    HASH  limit (optional override; lib.lua)
-- KEYS[3] queue    ZSET  request id -> finish tag (lib.lua)
-- KEYS[4] waiters  HASH  queued request id -> its tenant (lib.lua)
-- KEYS[5] heads    ZSET  tenant -> tag of its first grantable entry
-- KEYS[6] pausable HASH  permit holder -> "<rank>:<since ms>:<pauses>:<tokens>"
--                        (pausable.lua)
-- KEYS[7] asked    HASH  victim id -> the waiter it is asked to pause for
-- ARGV[1] waiter id
-- ARGV[2] the waiter's class rank (0: most urgent)
-- ARGV[3] default permit limit
-- ARGV[4] min tokens since (re)start
-- ARGV[5] max pauses
-- Returns the victim's id, or "" when none may be paused.
local waiter, rank = ARGV[1], tonumber(ARGV[2])
local min_tokens, max_pauses = tonumber(ARGV[4]), tonumber(ARGV[5])

local tag = redis.call('ZSCORE', KEYS[3], waiter)
local tenant = redis.call('HGET', KEYS[4], waiter)
if not tag or not tenant or not redis.call('ZSCORE', KEYS[5], tenant) then return '' end
local limit = tonumber(redis.call('HGET', KEYS[2], 'limit') or ARGV[3])
if redis.call('ZCARD', KEYS[1]) < limit then return '' end

-- A victim asked earlier and still holding its permit is the waiter's
-- already; one that gave it back is forgotten.
local asked = redis.call('HGETALL', KEYS[7])
for i = 1, #asked, 2 do
  if not redis.call('ZSCORE', KEYS[1], asked[i]) then
    redis.call('HDEL', KEYS[7], asked[i])
  elseif asked[i + 1] == waiter then
    return asked[i]
  end
end

local best, best_rank, best_since
local all = redis.call('HGETALL', KEYS[6])
for i = 1, #all, 2 do
  local id = all[i]
  local r, since, pauses, tokens = string.match(all[i + 1], '^(%d+):(%d+):(%d+):(%d+)$')
  r, since, pauses, tokens = tonumber(r), tonumber(since), tonumber(pauses), tonumber(tokens)
  if not redis.call('ZSCORE', KEYS[1], id) then
    redis.call('HDEL', KEYS[6], id)
  elseif r and r > rank and tokens >= min_tokens and pauses < max_pauses
      and redis.call('HEXISTS', KEYS[7], id) == 0 then
    if best == nil or r > best_rank or (r == best_rank and (since < best_since
        or (since == best_since and id < best))) then
      best, best_rank, best_since = id, r, since
    end
  end
end
if not best then return '' end
redis.call('HSET', KEYS[7], best, waiter)
return best
