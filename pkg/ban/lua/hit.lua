-- Count one request against each of its subjects (its IP, and its key if
-- it has one) and ban a subject that went over the threshold. One call per
-- request: it also answers whether a subject is banned already. On Redis
-- Cluster each subject's keys are in a slot of their own (their hash tag
-- is the subject), so the caller makes one call per subject, in order, and
-- the index is in none of them.
-- KEYS[1], KEYS[2] the first subject's counter (hash) and ban (string)
-- KEYS[3], KEYS[4] the second subject's, if any
-- KEYS[#KEYS]      if #KEYS is odd: the ban index (zset: "kind:value" ->
--                  ban end, ms); when it is not given, the caller adds a
--                  ban imposed here to it
-- ARGV[1] threshold: more requests than this in a window bans
-- ARGV[2] window ms  ARGV[3] ban ms
-- ARGV[4], ARGV[5] the subjects' index members ("ip:203.0.113.9")
-- Returns {subject (0 none, 1 first, 2 second), remaining ban ms,
-- 1 if this call imposed the ban, the ban's end (ms, Redis's clock) if it
-- did}.
--
-- A counter is a sliding window estimated from two fixed ones (fields w:
-- the current window's number, c: its count, p: the previous window's
-- count): c + p * (the share of the previous window still inside the
-- sliding one). Two numbers per subject, exact enough for a ban, and no
-- burst straddling a window boundary goes unseen.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local threshold = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local ban_ms = tonumber(ARGV[3])
local n = math.floor(#KEYS / 2)
local index = false
if #KEYS % 2 == 1 then index = KEYS[#KEYS] end

for i = 1, n do
  local left = redis.call('PTTL', KEYS[2 * i])
  if left > 0 then
    return {i, left, 0, 0}
  end
end

local idx = math.floor(now / window)
local into = (now % window) / window
for i = 1, n do
  local counter = KEYS[2 * i - 1]
  local st = redis.call('HMGET', counter, 'w', 'c', 'p')
  local w, c, p = tonumber(st[1]), tonumber(st[2]) or 0, tonumber(st[3]) or 0
  if w == idx then
    c = c + 1
  elseif w == idx - 1 then
    p, c = c, 1
  else
    p, c = 0, 1
  end
  redis.call('HSET', counter, 'w', idx, 'c', c, 'p', p)
  redis.call('PEXPIRE', counter, 2 * window)
  if c + p * (1 - into) > threshold then
    redis.call('SET', KEYS[2 * i], now, 'PX', ban_ms)
    if index then redis.call('ZADD', index, now + ban_ms, ARGV[3 + i]) end
    redis.call('DEL', counter)
    return {i, ban_ms, 1, now + ban_ms}
  end
end
return {0, 0, 0, 0}
