-- Read a kb's version and the L2 entry of a query at that version in one
-- round trip: a cache hit needs nothing else.
-- KEYS[1] the kb's version key
-- ARGV[1] the entry key up to the version   ARGV[2] the rest of the key
-- Returns {version, entry or false}; version "0" (unversioned) reads no
-- entry. The entry key is built here from the version it names, so it is
-- not declared in KEYS; it has the kb's hash tag, as KEYS[1] has, so on
-- Redis Cluster it is in the declared key's slot, as a script requires.
local v = redis.call('GET', KEYS[1]) or '0'
if v == '0' then
  return {v, false}
end
return {v, redis.call('GET', ARGV[1] .. v .. ARGV[2])}
