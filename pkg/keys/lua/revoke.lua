-- Revoke a managed key and tell every API instance to drop it from its
-- cache, in one step, so that no instance can miss a revocation it could
-- otherwise have read.
-- KEYS[1] the key's record
-- ARGV[1] id  ARGV[2] the invalidation channel
-- Returns 0 if there is no such key, 1 if it is revoked now, 2 if it
-- already was.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local was = redis.call('HGET', KEYS[1], 'revoked')
if not was then
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'revoked', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end
-- Published again for a key already revoked: an instance that missed the
-- first message (pub/sub is at most once) gets another chance.
redis.call('PUBLISH', ARGV[2], ARGV[1])
if was then
  return 2
end
return 1
