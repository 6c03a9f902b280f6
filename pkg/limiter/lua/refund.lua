-- Give back the unused part of a reservation, exactly once: the
-- reservation is deleted, so a second call refunds nothing.
-- KEYS[1]  reservation key (written by reserve.lua)
-- ARGV[1]  tokens used (charged to buckets that count tokens)
-- ARGV[2]  requests used, 0 or 1 (charged to buckets that count requests)
-- Returns 1 if the reservation was refunded, 0 if there was none.
-- Bucket keys come from the reservation, not from KEYS: a single Redis
-- (not Cluster) is assumed, as for the multi-bucket reserve itself.
local rsv = KEYS[1]
local entries = redis.call('HGETALL', rsv)
if #entries == 0 then return 0 end
local used_tokens = tonumber(ARGV[1])
local used_requests = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function f(x) return string.format('%.17g', x) end

for j = 1, #entries, 2 do
  local key, cap, rate, cost, kind = string.match(entries[j + 1], '^(.-)\n(.-)\n(.-)\n(.-)\n(.-)$')
  cap, rate, cost = tonumber(cap), tonumber(rate), tonumber(cost)
  local used = used_tokens
  if kind == 'r' then used = used_requests end
  local back = cost - math.min(cost, used)
  if back > 0 then
    local st = redis.call('HMGET', key, 'tokens', 'ts')
    local tokens, ts = tonumber(st[1]), tonumber(st[2])
    if tokens == nil or ts == nil then
      tokens = cap
    elseif now > ts then
      tokens = math.min(cap, tokens + (now - ts) / 1000000 * rate)
    end
    tokens = math.min(cap, tokens + back)
    redis.call('HSET', key, 'tokens', f(tokens), 'ts', now)
    redis.call('PEXPIRE', key, math.ceil((cap - tokens) / rate * 1000) + 1000)
  end
end
redis.call('DEL', rsv)
return 1
