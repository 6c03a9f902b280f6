-- What changed in a knowledge base since a version, read atomically: the
-- current version and epoch, then per document changed after `since` its
-- id and its current revision (false when it was deleted).
-- KEYS[1] version   KEYS[2] docs   KEYS[3] log   KEYS[4] epoch
-- ARGV[1] since
local version = tonumber(redis.call('GET', KEYS[1]) or '0')
local out = {version, redis.call('GET', KEYS[4]) or ''}
if version <= tonumber(ARGV[1]) then return out end
local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf')
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id)
end
return out
