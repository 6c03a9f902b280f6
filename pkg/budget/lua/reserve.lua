-- Charge a request's upper bound to its tenant's budget for the month, if
-- it fits: used (settled usage and every open reservation) plus the charge
-- must stay within each limit that is set. All or nothing.
--
-- KEYS[1]  the tenant's month: a hash of tokens, micros (micro-dollars),
--          epoch (when it was made), warned:<kind> (the 80 % warning was
--          given) and r:<request id> ("<tokens> <micros>" reserved)
-- ARGV[1]  request id
-- ARGV[2]  tokens charged; ARGV[3] micro-dollars charged
-- ARGV[4]  token limit; ARGV[5] micro-dollar limit (0: none)
-- ARGV[6]  when the hash expires, unix ms (a while after its month ends)
-- ARGV[7]  "1" when ARGV[8] (tokens) and ARGV[9] (micros) are the month's
--          usage rebuilt from the ledger, to start a missing hash with
-- Returns {status, tokens, micros, epoch, warn_tokens, warn_spend}: the
-- month's tokens and micros after the decision, and 1 in warn_<kind> when
-- this charge took that kind past 80 % of its limit first this month.
--   status 0 = the hash is missing (Redis lost it, or the month is new):
--              read the ledger and call again with ARGV[7] = "1"
--          1 = charged (or charged already: the same request again)
--          2 = the token limit would be passed; 3 = the spend limit
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then
  if ARGV[7] ~= '1' then return {0, 0, 0, '', 0, 0} end
  -- Whoever rebuilds first sets it; a concurrent rebuild finds it made.
  local t = redis.call('TIME')
  redis.call('HSET', key, 'tokens', ARGV[8], 'micros', ARGV[9], 'epoch', t[1] .. '.' .. t[2])
  redis.call('PEXPIREAT', key, ARGV[6])
end
local v = redis.call('HMGET', key, 'tokens', 'micros', 'epoch', 'r:' .. ARGV[1])
local used_t, used_m, epoch = tonumber(v[1]) or 0, tonumber(v[2]) or 0, v[3] or ''
if v[4] then return {1, used_t, used_m, epoch, 0, 0} end
local lim_t, lim_m = tonumber(ARGV[4]), tonumber(ARGV[5])
if lim_t > 0 and used_t + tonumber(ARGV[2]) > lim_t then return {2, used_t, used_m, epoch, 0, 0} end
if lim_m > 0 and used_m + tonumber(ARGV[3]) > lim_m then return {3, used_t, used_m, epoch, 0, 0} end
used_t = redis.call('HINCRBY', key, 'tokens', ARGV[2])
used_m = redis.call('HINCRBY', key, 'micros', ARGV[3])
redis.call('HSET', key, 'r:' .. ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
local warn_t, warn_m = 0, 0
if lim_t > 0 and used_t * 5 >= lim_t * 4 then warn_t = redis.call('HSETNX', key, 'warned:tokens', 1) end
if lim_m > 0 and used_m * 5 >= lim_m * 4 then warn_m = redis.call('HSETNX', key, 'warned:spend', 1) end
return {1, used_t, used_m, epoch, warn_t, warn_m}
