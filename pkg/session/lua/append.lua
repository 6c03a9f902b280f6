-- Append one turn to a session, once: a retried call (its first answer
-- lost) finds its request id among the newest turns and adds nothing.
-- Keeps the newest ARGV[3] turns and makes the session expire ARGV[4] ms
-- after its last turn.
-- KEYS[1] session list
-- ARGV[1] the turn's prefix that names its request ('{"request_id":"…",')
-- ARGV[2] turn (JSON)   ARGV[3] max turns   ARGV[4] ttl ms
-- Returns 1 if appended, 0 if the turn was already there.
local max = tonumber(ARGV[3])
local marker = ARGV[1]
for _, t in ipairs(redis.call('LRANGE', KEYS[1], -max, -1)) do
  if string.sub(t, 1, #marker) == marker then
    return 0
  end
end
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('LTRIM', KEYS[1], -max, -1)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
