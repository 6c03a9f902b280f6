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
-- Redis's cost model, where each redis.call costs more than all the
-- arithmetic of a decision: one MGET of every bucket; one SET per bucket
-- changed, however many requests of the batch charged it; one HSET and
-- one PEXPIREAT for all the reservations of the batch; numbers passed as
-- packed doubles, not text to parse; no table created per request (Lua's
-- garbage is collected inside Redis's event loop).
--
-- KEYS     every request's bucket keys, in order; then the batch's
--          reservation key (a hash, new for each call). On Redis Cluster
--          they are all of one bucket group (one hash tag), and a request
--          with buckets in several groups comes once per group (see the
--          package doc).
-- ARGV[1]  m
-- ARGV[2]  per request: n (one byte), then capacity, refill per second
--          and cost of each of its n buckets (little-endian doubles)
-- ARGV[3]  reservation ttl, ms
-- A request charged gets field i (its place in the batch) in the
-- reservation hash: refund.lua deletes it, so that the unused part is
-- given back exactly once.
-- Returns, per request in order: status, index, retry_after_µs, then its
-- n bucket levels after its decision in thousandths of a token, floored.
--   status 1 = charged,
--          2 = refused: bucket `index` lacks tokens, enough in retry_after,
--          3 = never: bucket `index` is smaller than the cost.
local m = tonumber(ARGV[1])
local packed = ARGV[2]
local rsv = KEYS[#KEYS]

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local now_ms = math.floor(now / 1000)

local vals = redis.call('MGET', unpack(KEYS, 1, #KEYS - 1))

-- Per bucket key: level as of now (after the charges so far), stored
-- expiry, capacity and rate (from the first request that names it), and
-- whether it changed.
local level, expires, caps, rates, dirty = {}, {}, {}, {}, {}
-- One request's costs, reused.
local costs = {}
-- HSET arguments: field, value per request charged.
local fields, f = {}, 0
local reply, o = {}, 0
local pos, k = 1, 0
for r = 1, m do
  local n
  n, pos = struct.unpack('<B', packed, pos)
  local status, index, retry = 1, 0, 0
  for i = 1, n do
    local key = KEYS[k + i]
    local cap, rate, cost
    cap, rate, cost, pos = struct.unpack('<ddd', packed, pos)
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
  if status == 1 then
    fields[f + 1], fields[f + 2] = r, 1
    f = f + 2
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
  k = k + n
end

if f > 0 then
  redis.call('HSET', rsv, unpack(fields, 1, f))
  redis.call('PEXPIREAT', rsv, now_ms + tonumber(ARGV[3]))
end
-- In KEYS order, so that the writes are the same on every run.
for i = 1, #KEYS - 1 do
  local key = KEYS[i]
  if dirty[key] then
    dirty[key] = nil
    bucket_store(key, level[key], caps[key], rates[key], expires[key], now, now_ms)
  end
end
return reply
