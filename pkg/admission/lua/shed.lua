-- Shed the lowest tier's waiters: remove every queued entry of the lowest
-- weight among those waiting, as a release of a queued entry does, and
-- tombstone each (value 'shed') so that a late re-check or a retried
-- enqueue answers "shed" instead of queueing it again. Permits are not
-- touched: shedding frees no permit, so nobody is granted.
--
-- It sheds nothing unless at least two distinct weights wait: shedding is
-- to protect higher tiers from a lower one, and with one tier waiting it
-- would only empty the queue, which the queue's own timeouts do more
-- fairly. Entries without a recorded weight (queued before weights were
-- kept) are never shed.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] liveness key prefix
-- ARGV[2] tombstone key prefix
-- ARGV[3] tombstone ttl ms: how long enqueue answers "shed" for an id
-- ARGV[4] most entries to shed (0 = no cap); the lowest weight's entries
--         nearest the tail (the newest in virtual time) go first
-- ARGV[5] key of this shed ("" = none): a shed sent again with the same key
--         (a retried activity whose reply was lost) answers what the first
--         did instead of shedding the next tier
-- Returns {weight shed (0 if none), ids shed...}
local alive_prefix, tomb_prefix = ARGV[1], ARGV[2]
local tomb_ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local done_key = ARGV[5]
if done_key ~= '' then
  local earlier = redis.call('GET', done_key)
  if earlier then return cjson.decode(earlier) end
end
local function answer(reply)
  if done_key ~= '' then
    redis.call('SET', done_key, cjson.encode(reply), 'PX', tomb_ttl)
  end
  return reply
end

-- Only entries still queued count: a weight without its entry is stale
-- bookkeeping, dropped on the way.
local all = redis.call('HGETALL', K.weights)
local entries, seen = {}, {}
local lowest, distinct = nil, 0
for i = 1, #all, 2 do
  local id, w = all[i], tonumber((split(all[i + 1])))
  local tag = redis.call('ZSCORE', K.queue, id)
  if not tag then
    redis.call('HDEL', K.weights, id)
  elseif w then
    entries[#entries + 1] = {id, w, tonumber(tag)}
    if not seen[w] then
      seen[w] = true
      distinct = distinct + 1
      if lowest == nil or w < lowest then lowest = w end
    end
  end
end
if distinct < 2 then
  return answer({0})
end

-- Take the victims newest tag first, so that a cap sheds those that
-- would have waited longest anyway.
local victims = {}
for _, e in ipairs(entries) do
  if e[2] == lowest then victims[#victims + 1] = {e[1], e[3]} end
end
table.sort(victims, function(a, b) return a[2] > b[2] end)

local reply = {lowest}
for _, v in ipairs(victims) do
  if cap > 0 and #reply > cap then break end
  local id = v[1]
  if unqueue(id) == 1 then
    redis.call('DEL', alive_prefix .. id)
    redis.call('SET', tomb_prefix .. id, 'shed', 'PX', tomb_ttl)
    reply[#reply + 1] = id
  end
end
if #reply == 1 then reply[1] = 0 end
return answer(reply)
