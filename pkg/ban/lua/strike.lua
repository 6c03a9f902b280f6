-- Count one strike against each subject of a request (its IP, and its key
-- if it has one) and ban a subject that went over the threshold. A strike
-- is what abuse looks like, never an admitted request: a refused
-- credential (ARGV[4] < 0: every call strikes), or a request that came
-- back while a Retry-After it was given is still in force (ARGV[4] >= 0:
-- the call is a refusal with a Retry-After of ARGV[5] ms; it strikes only
-- if the subject was told to wait at least ARGV[4] ms ago and that wait
-- has not run out, so requests already in flight when the first refusal
-- went out are not counted). On Redis Cluster each subject's keys are in
-- a slot of their own (their hash tag is the subject), so the caller
-- makes one call per subject, in order, and the index is in none of them.
-- KEYS[3i-2], KEYS[3i-1], KEYS[3i] the i-th subject's counter (hash), ban
--                  (string: its start, ms) and notice (string: when it
--                  was first told to wait, ms)
-- KEYS[#KEYS]      if #KEYS % 3 == 1: the ban index (zset: "kind:value" ->
--                  ban end, ms); when it is not given, the caller adds a
--                  ban imposed here to it
-- ARGV[1] threshold: more strikes than this in a window bans
-- ARGV[2] window ms  ARGV[3] ban ms
-- ARGV[4] grace ms, or -1 for a refused credential
-- ARGV[5] the refusal's Retry-After ms (0 for a refused credential)
-- ARGV[6], ARGV[7] the subjects' index members ("ip:<hash>")
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
local grace = tonumber(ARGV[4])
local notice_ms = tonumber(ARGV[5])
local n = math.floor(#KEYS / 3)
local index = false
if #KEYS % 3 == 1 then index = KEYS[#KEYS] end

for i = 1, n do
  local left = redis.call('PTTL', KEYS[3 * i - 1])
  if left > 0 then
    return {i, left, 0, 0}
  end
end

local idx = math.floor(now / window)
local into = (now % window) / window
for i = 1, n do
  local strike = grace < 0
  if not strike then
    local notice = KEYS[3 * i]
    local told = tonumber(redis.call('GET', notice))
    if told then
      strike = now - told >= grace
      if redis.call('PTTL', notice) < notice_ms then
        redis.call('PEXPIRE', notice, notice_ms)
      end
    elseif notice_ms > 0 then
      redis.call('SET', notice, now, 'PX', notice_ms)
    end
  end
  if strike then
    local counter = KEYS[3 * i - 2]
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
      redis.call('SET', KEYS[3 * i - 1], now, 'PX', ban_ms)
      if index then redis.call('ZADD', index, now + ban_ms, ARGV[5 + i]) end
      redis.call('DEL', counter, KEYS[3 * i])
      return {i, ban_ms, 1, now + ban_ms}
    end
  end
end
return {0, 0, 0, 0}
