-- Give back the unused part of a reservation, exactly once: the
-- reservation is deleted, so a second call refunds nothing.
-- KEYS[1]  reservation key (written by reserve.lua)
-- ARGV[1]  tokens used (charged to buckets that count tokens)
-- ARGV[2]  requests used, 0 or 1 (charged to buckets that count requests)
-- Returns 1 if the reservation was refunded, 0 if there was none.
-- The reservation record is one line per bucket, "<capacity> <rate>
-- <cost> <kind t|r> <key>"; bucket keys come from it, not from KEYS: a
-- single Redis (not Cluster) is assumed, as for the multi-bucket reserve.
local rsv = KEYS[1]
local record = redis.call('GET', rsv)
if not record then return 0 end
redis.call('DEL', rsv)
local used_tokens = tonumber(ARGV[1])
local used_requests = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local now_ms = math.floor(now / 1000)

for line in string.gmatch(record, '[^\n]+') do
  local cap, rate, cost, kind, key = string.match(line, '^(%S+) (%S+) (%S+) (%S+) (.+)$')
  cap, rate, cost = tonumber(cap), tonumber(rate), tonumber(cost)
  local used = used_tokens
  if kind == 'r' then used = used_requests end
  local back = cost - math.min(cost, used)
  if back > 0 then
    local tokens, expires = bucket_level(redis.call('GET', key), cap, rate, now)
    tokens = math.min(cap, tokens + back)
    bucket_store(key, tokens, cap, rate, expires, now, now_ms)
  end
end
return 1
