-- Add one process's latest observations into the current time slot of each
-- series. A slot is one string per (series, slot) read as signed 64-bit
-- big-endian integers (BITFIELD's i64): the sum of Add, the latencies'
-- sum in µs, then the histogram's bucket counts. Every process adds into
-- the same strings, so a slot holds what all of them saw. The slot comes
-- from Redis's clock, not the caller's, so processes with skewed clocks
-- still agree on it.
--
-- One BITFIELD adds all of a series' non-empty buckets in Redis's own
-- code: a HINCRBY per bucket, or unpacking and adding in Lua, cost Redis
-- several times more per flush.
--
-- KEYS     per series, its key base; the slot number is appended here
-- ARGV[1]  now, ms; 0 = Redis's clock (tests pass their own)
-- ARGV[2]  slot length, ms
-- ARGV[3]  retention, ms: a slot lives this long after it ends
-- ARGV[4…] per series, in KEYS order: k, then k BITFIELD arguments
--          (INCRBY i64 #index increment, …)
-- Returns the slot number written.
local now = now_ms(ARGV[1])
local slot_ms = tonumber(ARGV[2])
local slot = math.floor(now / slot_ms)
-- Relative, so that a test's clock far from Redis's still gets keys that
-- live as long as they would in production.
local ttl = (slot + 1) * slot_ms + tonumber(ARGV[3]) - now
local suffix = string.format('%d', slot)
local a = 4
for i = 1, #KEYS do
  local key = KEYS[i] .. suffix
  local k = tonumber(ARGV[a])
  if k > 0 then
    redis.call('BITFIELD', key, unpack(ARGV, a + 1, a + k))
    redis.call('PEXPIRE', key, ttl)
  end
  a = a + 1 + k
end
return slot
