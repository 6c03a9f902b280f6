-- Remove a document from a knowledge base and bump its version. Its last
-- revision is kept for a grace period (requests in flight may still hold
-- its chunk ids); the retrieval-cache entries that contained it are
-- deleted. See put.lua for the keys, and for those built here.
-- KEYS[1] version   KEYS[2] docs   KEYS[3] info   KEYS[4] log   KEYS[5] usage
-- KEYS[6] ids
-- ARGV[1] the kb's key prefix   ARGV[2] document id   ARGV[3] grace ms
-- Returns {version, 1} when deleted, {version, 0} when there was no such
-- document.
local kp, id, grace = ARGV[1], ARGV[2], tonumber(ARGV[3])
-- Looked up before the kb is indexed: a delete of a document (or kb) that
-- does not exist writes nothing.
local old = redis.call('HGET', KEYS[2], id)
if not old then
  return {tonumber(redis.call('GET', KEYS[1]) or '0'), 0}
end
ensure_index(KEYS[2], KEYS[3], KEYS[6], KEYS[5])
redis.call('HDEL', KEYS[2], id)
redis.call('ZREM', KEYS[6], id)
local info = redis.call('HGET', KEYS[3], id)
if info then
  local doc = cjson.decode(info)
  for f, from in pairs({bytes = 'bytes', memory = 'memory_bytes'}) do
    local n = doc[from] or 0
    if n ~= 0 then redis.call('HINCRBY', KEYS[5], f, string.format('%d', -n)) end
  end
end
local chunks = chunks_of(info)
if chunks ~= 0 then redis.call('HINCRBY', KEYS[5], 'chunks', -chunks) end
redis.call('HDEL', KEYS[3], id)
redis.call('PEXPIRE', kp .. 'rev:' .. id .. ':' .. old, grace)
drop_cached(kp .. 'l2doc:' .. id, hash_tag(KEYS[1]))
local version = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[4], version, id)
return {version, 1}
