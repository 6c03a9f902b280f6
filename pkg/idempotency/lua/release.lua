-- Releases an idempotency key, but only the claim it was asked to
-- release: a request whose start failed gives its key back for a retry,
-- and must not delete a newer claim by another request.
--
-- KEYS[1]  the idempotency key
-- ARGV[1]  the claim's value (request id and fingerprint)
--
-- Returns 1 when released, 0 when the key holds another claim or none.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
