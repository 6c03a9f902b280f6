-- Decide m requests in order, each charged against every bucket that
-- applies to it, all or nothing: if any of its buckets lacks the tokens,
-- nothing is charged anywhere for that request. One request is m = 1; the
-- limiter batches concurrent requests into one call, because on a busy
-- door the cost of a script call and its round trip is a large part of a
-- decision. Decisions in a batch are exactly the decisions the same
-- requests would get one call at a time in that order: a later one sees
-- what an earlier one charged.
--
-- Buckets refill continuously; the fractional part of a refill is kept
-- (the level is a double, time in microseconds from Redis's own clock), so
-- no refill is ever lost to rounding.
--
-- This is the hot path of every request at the door, so it is written for
-- Redis's cost model: one MGET of every bucket and reservation; one SET
-- per reservation charged and one per bucket changed, however many
-- requests of the batch charged it; no table created per request (Lua's
-- garbage is collected inside Redis's event loop).
--
-- KEYS     per request: its n bucket keys, then its reservation key (what
--          was charged, so that exactly one refund can give back the
--          unused part)
-- ARGV[1]  m
--          then per request: n; capacity, refill per second, cost for each
--          bucket; reservation ttl ms; reservation record (what refund.lua
--          reads back)
-- Returns, per request in order: status, index, retry_after_µs, then its
-- n bucket levels after its decision in thousandths of a token, floored.
--   status 1 = charged (or already charged under this reservation),
--          2 = refused: bucket `index` lacks tokens, enough in retry_after,
--          3 = never: bucket `index` is smaller than the cost.
local m = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local now_ms = math.floor(now / 1000)

local vals = redis.call('MGET', unpack(KEYS))

-- Per bucket key: level as of now (after the charges so far), stored
-- expiry, capacity and rate (from the first request that names it), and
-- whether it changed.
local level, expires, caps, rates, dirty = {}, {}, {}, {}, {}
local charged = {}
-- One request's costs, reused.
local costs = {}
local reply, o = {}, 0
local a, k = 2, 0
for _ = 1, m do
  local n = tonumber(ARGV[a])
  a = a + 1
  local status, index, retry = 1, 0, 0
  for i = 1, n do
    local key = KEYS[k + i]
    local cap, rate, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
    a = a + 3
    costs[i] = cost
    local lv = level[key]
    if not lv then
      caps[key], rates[key] = cap, rate
      lv, expires[key] = bucket_level(vals[k + i], cap, rate, now)
      level[key] = lv
    end
    if cost > cap then
      if status ~= 3 then status, index, retry = 3, i, 0 end
    elseif lv < cost and status ~= 3 then
      local wait = (cost - lv) / rate
      if status == 1 or wait > retry then status, index, retry = 2, i, wait end
    end
  end
  local rsv = KEYS[k + n + 1]
  if vals[k + n + 1] or charged[rsv] then
    -- Already charged, by an earlier call whose reply was lost or by an
    -- earlier request of this batch: that one passed, and so does this
    -- one, without a second charge.
    status, index, retry = 1, 0, 0
  elseif status == 1 then
    charged[rsv] = true
    redis.call('SET', rsv, ARGV[a + 1], 'PXAT', now_ms + tonumber(ARGV[a]))
    for i = 1, n do
      local key = KEYS[k + i]
      level[key] = level[key] - costs[i]
      dirty[key] = true
    end
  end
  reply[o + 1], reply[o + 2], reply[o + 3] = status, index, math.ceil(retry * 1000000)
  o = o + 3
  for i = 1, n do
    o = o + 1
    reply[o] = math.floor(level[KEYS[k + i]] * 1000)
  end
  a, k = a + 2, k + n + 1
end

-- In KEYS order, so that the writes are the same on every run.
for i = 1, #KEYS do
  local key = KEYS[i]
  if dirty[key] then
    dirty[key] = nil
    bucket_store(key, level[key], caps[key], rates[key], expires[key], now, now_ms)
  end
end
return reply
