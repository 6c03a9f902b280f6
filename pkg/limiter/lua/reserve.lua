-- Charge one request against every bucket that applies to it, all or
-- nothing: if any bucket lacks the tokens, nothing is charged anywhere.
-- Buckets refill continuously; the fractional part of a refill is kept
-- (tokens are stored as a full-precision float, time in microseconds from
-- Redis's own clock), so no refill is ever lost to rounding.
-- KEYS[1..n]  bucket keys (HASH: tokens, ts)
-- KEYS[n+1]   reservation key: what was charged, so that exactly one later
--             refund can give back the unused part
-- ARGV[1]     n
-- ARGV[2+4(i-1)] .. ARGV[5+4(i-1)]
--             bucket i: capacity, refill per second, cost, kind ("t" for
--             tokens, "r" for requests: which usage a refund compares)
-- ARGV[2+4n]  reservation ttl ms
-- Returns {status, index, retry_after_s, remaining_1..n, reset_s_1..n}
--   status 1 = charged (or already charged under this reservation),
--          2 = refused: bucket `index` lacks tokens, enough in retry_after_s
--          3 = never: bucket `index` is smaller than the cost
--   floats are returned as strings so that Redis does not truncate them.
local n = tonumber(ARGV[1])
local rsv = KEYS[n + 1]
local ttl = tonumber(ARGV[2 + 4 * n])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local function f(x) return string.format('%.17g', x) end

local level, cap, rate, cost, kind = {}, {}, {}, {}, {}
local status, index, retry = 1, 0, 0
for i = 1, n do
  local a = 2 + 4 * (i - 1)
  cap[i], rate[i], cost[i], kind[i] = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), ARGV[a + 3]
  local st = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens, ts = tonumber(st[1]), tonumber(st[2])
  if tokens == nil or ts == nil then
    tokens = cap[i]
  elseif now > ts then
    tokens = math.min(cap[i], tokens + (now - ts) / 1000000 * rate[i])
  end
  level[i] = tokens
  if cost[i] > cap[i] then
    if status ~= 3 then status, index, retry = 3, i, 0 end
  elseif tokens < cost[i] and status ~= 3 then
    local wait = (cost[i] - tokens) / rate[i]
    if status == 1 or wait > retry then status, index, retry = 2, i, wait end
  end
end

local already = redis.call('EXISTS', rsv) == 1
if status == 1 and not already then
  for i = 1, n do
    level[i] = level[i] - cost[i]
    redis.call('HSET', KEYS[i], 'tokens', f(level[i]), 'ts', now)
    -- A bucket left alone refills completely; after that it is the same
    -- as an absent key, so it may expire.
    redis.call('PEXPIRE', KEYS[i], math.ceil((cap[i] - level[i]) / rate[i] * 1000) + 1000)
    redis.call('HSET', rsv, i, table.concat({KEYS[i], f(cap[i]), f(rate[i]), f(cost[i]), kind[i]}, '\n'))
  end
  redis.call('PEXPIRE', rsv, ttl)
end
if already then status, index, retry = 1, 0, 0 end

local reply = {status, index, f(retry)}
for i = 1, n do reply[#reply + 1] = f(level[i]) end
for i = 1, n do reply[#reply + 1] = f((cap[i] - level[i]) / rate[i]) end
return reply
