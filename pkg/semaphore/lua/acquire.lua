-- Take one of a semaphore's permits, if one is free and the holder's
-- group (a tenant) holds less than its share. Holders are members
-- "h<TAB><group><TAB><holder>" of a ZSET scored by when their lease ends
-- (ms, Redis's clock); a holder whose lease ended without a renewal (a
-- crashed process) is dropped first, so its permit comes back by itself.
-- A member without the prefix is a holder of group "".
--
-- A group's share is the permits divided among the groups holding or
-- waiting for one, rounded up, and at most the group limit. A group that
-- is refused leaves a mark, "w<TAB><group>" scored by when it lapses, so
-- that while it waits the others' share is smaller and the next permits
-- to come back are its; a holder over its share keeps its permit until it
-- gives it back (nothing is taken from running work).
-- KEYS[1] holders   ARGV[1] member   ARGV[2] group   ARGV[3] limit
-- ARGV[4] group limit   ARGV[5] lease ms   ARGV[6] how long a waiting
-- mark lasts, ms (a few of the waiter's polls)
-- Returns 1 if the holder now has a permit (also when it already had
-- one: its lease is renewed), 0 if not.
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local key, member, group = KEYS[1], ARGV[1], ARGV[2]
local limit, group_limit = tonumber(ARGV[3]), tonumber(ARGV[4])
local lease, mark = tonumber(ARGV[5]), tonumber(ARGV[6])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)

local function keep_alive()
  redis.call('PEXPIRE', key, math.max(lease, mark) * 2)
end

if redis.call('ZSCORE', key, member) then
  redis.call('ZADD', key, now + lease, member)
  keep_alive()
  return 1
end

local held, mine = 0, 0
local groups, active = {[group] = true}, 1
for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
  local g
  if string.sub(m, 1, 2) == 'w\t' then
    g = string.sub(m, 3)
  else
    held = held + 1
    g = ''
    if string.sub(m, 1, 2) == 'h\t' then
      local tab = string.find(m, '\t', 3, true)
      if tab then g = string.sub(m, 3, tab - 1) end
    end
    if g == group then mine = mine + 1 end
  end
  if not groups[g] then
    groups[g] = true
    active = active + 1
  end
end

local share = math.min(group_limit, math.ceil(limit / active))
if held < limit and mine < share then
  redis.call('ZADD', key, now + lease, member)
  keep_alive()
  return 1
end
redis.call('ZADD', key, now + mark, 'w\t' .. group)
keep_alive()
return 0
