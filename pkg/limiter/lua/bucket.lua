-- Shared by reserve.lua and refund.lua (prepended to each).
--
-- A bucket is one 24-byte string, three little-endian doubles: its level
-- after its last change, when that was (µs, Redis TIME) and when its key
-- expires (ms). Binary rather than text because a float printed and parsed
-- back costs more than the rest of a decision and is exact only with 17
-- digits; a double holds the level exactly and the times exactly (below
-- 2^53). A bucket left alone refills completely and is then the same as an
-- absent key, so it may expire, but never before it is full. Setting a TTL
-- on every write costs Redis more than the arithmetic, so the expiry is
-- kept in the value: a write keeps the TTL (KEEPTTL) while it still covers
-- the time to full, and only otherwise sets a new one, far enough out to
-- cover a refill from empty (capacity / rate).

-- bucket_level returns a bucket's level at now (µs) from its stored state
-- (false when absent: full) and the stored expiry (ms, 0 when absent).
local function bucket_level(state, cap, rate, now)
  if not state then return cap, 0 end
  local tokens, ts, expires = struct.unpack('<ddd', state)
  if now > ts then
    tokens = tokens + (now - ts) / 1000000 * rate
    if tokens > cap then tokens = cap end
  end
  return tokens, expires
end

-- bucket_store writes a bucket's new level at now, keeping its TTL when
-- the stored expiry still covers the time until it is full again.
local function bucket_store(key, tokens, cap, rate, expires, now, now_ms)
  local full_at = now_ms + math.ceil((cap - tokens) / rate * 1000) + 1000
  if expires >= full_at then
    redis.call('SET', key, struct.pack('<ddd', tokens, now, expires), 'KEEPTTL')
  else
    expires = now_ms + math.ceil(cap / rate * 1000) + 1000
    redis.call('SET', key, struct.pack('<ddd', tokens, now, expires), 'PXAT', expires)
  end
end

