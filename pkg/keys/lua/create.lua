-- Create a managed key's record, unless its id is already taken. Its id
-- is added to the set of every id by the caller, beforehand: the set is
-- one key, in its own Redis Cluster slot.
-- KEYS[1] the key's record (a hash)
-- ARGV[1] id  ARGV[2] hex SHA-256 of the plain key  ARGV[3] tenant
-- ARGV[4] user  ARGV[5] tier  ARGV[6] scopes, comma-separated
-- Returns the creation time in ms on Redis's clock, or 0 if the id is
-- taken (the caller draws another).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'hash', ARGV[2], 'tenant', ARGV[3], 'user', ARGV[4],
  'tier', ARGV[5], 'scopes', ARGV[6], 'created', now)
return now
