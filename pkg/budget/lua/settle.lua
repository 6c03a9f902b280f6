-- Replace a request's reservation with what it used, exactly once. What it
-- used beyond its reservation is charged all the same (the month counts
-- what the ledger records) and returned, for the caller to report.
--
-- KEYS[1]  the month hash the reservation was made in (see reserve.lua)
-- ARGV[1]  request id
-- ARGV[2]  the hash's epoch when the reservation was made
-- ARGV[3]  tokens used; ARGV[4] micro-dollars used
-- Returns {settled, over_tokens, over_micros}: settled is 1 when settled,
-- 0 when there was nothing to settle (settled before, or the hash is gone:
-- the next request rebuilds it from the ledger, which records the request
-- after it settles); over_* is what the usage passed the reservation by
-- (0 when it did not, or the reservation was lost with its hash).
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then return {0, 0, 0} end
local field = 'r:' .. ARGV[1]
local held = redis.call('HGET', key, field)
if held == 'settled' then return {0, 0, 0} end
local res_t, res_m = 0, 0
if held then
  local sp = string.find(held, ' ', 1, true)
  res_t, res_m = tonumber(string.sub(held, 1, sp - 1)), tonumber(string.sub(held, sp + 1))
  redis.call('HDEL', key, field)
else
  -- No reservation: settled already in this hash, or made in one Redis
  -- lost since. The hash was then rebuilt from a ledger that does not
  -- hold this request yet, so its usage is added here, and a mark keeps a
  -- retry from adding it again.
  if redis.call('HGET', key, 'epoch') == ARGV[2] then return {0, 0, 0} end
  redis.call('HSET', key, field, 'settled')
end
local used_t, used_m = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('HINCRBY', key, 'tokens', used_t - res_t)
redis.call('HINCRBY', key, 'micros', used_m - res_m)
if not held then return {1, 0, 0} end
return {1, math.max(used_t - res_t, 0), math.max(used_m - res_m, 0)}
