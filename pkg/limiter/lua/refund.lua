-- Give back the unused part of a reservation, exactly once: its field is
-- deleted from the batch's reservation hash, so a second call refunds
-- nothing (and the hash goes when its last field does).
-- KEYS[1]  the reservation hash (written by reserve.lua)
-- KEYS[2…] the reservation's bucket keys (of the hash's hash tag: one part
--          of a reservation, see limiter.go)
-- ARGV[1]  the reservation's field
-- ARGV[2]  tokens used (charged to buckets that count tokens)
-- ARGV[3]  requests used, 0 or 1 (charged to buckets that count requests)
-- ARGV[4…] per bucket: capacity, rate, cost charged, kind (t or r)
-- Returns 1 if the reservation was refunded, 0 if there was none.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
local used_tokens = tonumber(ARGV[2])
local used_requests = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local now_ms = math.floor(now / 1000)

for i = 2, #KEYS do
  local a = 4 + (i - 2) * 4
  local cap, rate, cost, kind = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), ARGV[a + 3]
  local used = used_tokens
  if kind == 'r' then used = used_requests end
  local back = cost - math.min(cost, used)
  if back > 0 then
    local key = KEYS[i]
    local tokens, expires = bucket_level(redis.call('GET', key), cap, rate, now)
    tokens = math.min(cap, tokens + back)
    bucket_store(key, tokens, cap, rate, expires, now, now_ms)
  end
end
return 1
