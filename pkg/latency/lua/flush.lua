-- Add one process's latest observations into the current time slot of each
-- series: a hash per (series, slot) whose fields are histogram buckets
-- ("0".."156": observations), "s" (their sum, µs) and "n" (the sum of
-- Add). Every process adds into the same hashes, so a slot holds what all
-- of them saw. The slot comes from Redis's clock, not the caller's, so
-- processes with skewed clocks still agree on it.
--
-- A flush is one call whatever the number of series: one HINCRBY per
-- non-empty bucket (Redis has no multi-field increment) and one PEXPIRE
-- per series.
--
-- KEYS     per series, its key base; the slot number is appended here
-- ARGV[1]  now, ms; 0 = Redis's clock (tests pass their own)
-- ARGV[2]  slot length, ms
-- ARGV[3]  retention, ms: a slot's key lives this long after its slot ends
-- ARGV[4…] per series, in KEYS order: n, then n field/increment pairs
-- Returns the slot number written.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local slot_ms = tonumber(ARGV[2])
local slot = math.floor(now / slot_ms)
-- Relative, so that a test's clock far from Redis's still gets keys that
-- live as long as they would in production.
local ttl = (slot + 1) * slot_ms + tonumber(ARGV[3]) - now
local a = 4
for i = 1, #KEYS do
  local key = KEYS[i] .. string.format('%d', slot)
  local n = tonumber(ARGV[a])
  for j = a + 1, a + 2 * n, 2 do
    redis.call('HINCRBY', key, ARGV[j], ARGV[j + 1])
  end
  a = a + 1 + 2 * n
  redis.call('PEXPIRE', key, ttl)
end
return slot
