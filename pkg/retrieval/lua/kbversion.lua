-- Assigns the version of a knowledge base's content, so that every worker
-- loading the same content agrees on one version and changed content bumps
-- it exactly once, however many workers load it concurrently.
--
-- KEYS[1]  version key: integer, incremented for each new content hash
-- KEYS[2]  hash key: content hash of the version in KEYS[1]
-- ARGV[1]  content hash of the corpus being loaded
--
-- Returns the version of ARGV[1]: the stored version if KEYS[2] already
-- holds ARGV[1], otherwise the incremented version (1 for a new kb).
-- Both keys live without expiry: losing them would reuse version numbers.
local stored = redis.call("GET", KEYS[2])
if stored == ARGV[1] then
  local version = redis.call("GET", KEYS[1])
  if version then
    return tonumber(version)
  end
end
redis.call("SET", KEYS[2], ARGV[1])
return redis.call("INCR", KEYS[1])
