-- Extend a held permit's lease. A holder calls it while it streams.
-- KEYS[1] permits  KEYS[2] grants
-- ARGV[1] request id
-- ARGV[2] lease ms
-- Returns 1 if the permit is still held (lease extended), 0 if it was lost
-- (its lease had already run out and it may be someone else's now). A
-- permit found expired is left for the next script with every key to
-- reclaim, so that its tenant's count is given back with it.
local now = now_ms()
local expiry = redis.call('ZSCORE', K.permits, ARGV[1])
if expiry and tonumber(expiry) > now then
  redis.call('ZADD', K.permits, 'XX', now + tonumber(ARGV[2]), ARGV[1])
  return 1
end
return 0
