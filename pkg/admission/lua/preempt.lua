-- Choose a stream to pause for an urgent waiter (preemption by
-- continuation), and record the request for the victim, whose keep-alive
-- reads it (pausable.lua) and acts on it (yield.lua). Standalone: no
-- lib.lua prelude.
-- A victim holds a permit (of a pool named below) and has said it can be paused
-- (pausable.lua: only a stream whose pool's backend can continue an
-- answer says so): it is of a class strictly less urgent than the
-- waiter's, has streamed at least min tokens since it (re)started, was
-- paused fewer than max times, and is not asked already. The least
-- urgent class goes first, then the stream running longest since its
-- last (re)start, then the smallest id, so the choice is deterministic.
-- Only a waiter whose tenant a free permit could go to now asks (its
-- tenant in heads: not held back by its cap), and only when no permit
-- is free for it: its pool is at its own limit, and then only a stream of
-- its pool may be paused (another pool's permit would not be its), or,
-- in a group of pools sharing a budget (pools.shared), the budget is
-- spent, and then a stream of any pool of the group may be: its permit
-- goes back to the budget, which the waiter's pool may take. A waiter
-- that has a victim asked already, in any pool of its group, gets that
-- one again, so a waiter pauses one stream at a time however often it
-- asks.
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
-- KEYS[8…] in a group, each other pool's permits, pausable and asked, in
--          that order (three keys per pool)
-- ARGV[1] waiter id
-- ARGV[2] the waiter's class rank (0: most urgent)
-- ARGV[3] default permit limit
-- ARGV[4] min tokens since (re)start
-- ARGV[5] max pauses
-- ARGV[6] the group's budget (0 or absent: a pool alone)
-- Returns the victim's id, "" when none may be paused, or false (nil)
-- when the waiter is not queued (granted, gone, or never queued here).
local waiter, rank = ARGV[1], tonumber(ARGV[2])
local min_tokens, max_pauses = tonumber(ARGV[4]), tonumber(ARGV[5])
local budget = tonumber(ARGV[6] or '0')

local tag = redis.call('ZSCORE', KEYS[3], waiter)
local tenant = redis.call('HGET', KEYS[4], waiter)
if not tag or not tenant then return false end
if not redis.call('ZSCORE', KEYS[5], tenant) then return '' end
local limit = tonumber(redis.call('HGET', KEYS[2], 'limit') or ARGV[3])

local pools = {{permits = KEYS[1], pausable = KEYS[6], asked = KEYS[7]}}
for j = 8, #KEYS, 3 do
  pools[#pools + 1] = {permits = KEYS[j], pausable = KEYS[j + 1], asked = KEYS[j + 2]}
end
-- The pools whose streams may be paused for the waiter.
local from = {pools[1]}
if redis.call('ZCARD', KEYS[1]) < limit then
  local used = 0
  for _, p in ipairs(pools) do used = used + redis.call('ZCARD', p.permits) end
  if budget <= 0 or used < budget then return '' end
  from = pools
end

-- A victim asked earlier and still holding its permit is the waiter's
-- already; one that gave it back is forgotten.
for _, p in ipairs(pools) do
  local asked = redis.call('HGETALL', p.asked)
  for i = 1, #asked, 2 do
    if not redis.call('ZSCORE', p.permits, asked[i]) then
      redis.call('HDEL', p.asked, asked[i])
    elseif asked[i + 1] == waiter then
      return asked[i]
    end
  end
end

local best, best_rank, best_since, best_pool
for _, p in ipairs(from) do
  local all = redis.call('HGETALL', p.pausable)
  for i = 1, #all, 2 do
    local id = all[i]
    local r, since, pauses, tokens = string.match(all[i + 1], '^(%d+):(%d+):(%d+):(%d+)$')
    r, since, pauses, tokens = tonumber(r), tonumber(since), tonumber(pauses), tonumber(tokens)
    if not redis.call('ZSCORE', p.permits, id) then
      redis.call('HDEL', p.pausable, id)
    elseif r and r > rank and tokens >= min_tokens and pauses < max_pauses
        and redis.call('HEXISTS', p.asked, id) == 0 then
      if best == nil or r > best_rank or (r == best_rank and (since < best_since
          or (since == best_since and id < best))) then
        best, best_rank, best_since, best_pool = id, r, since, p
      end
    end
  end
end
if not best then return '' end
redis.call('HSET', best_pool.asked, best, waiter)
return best
