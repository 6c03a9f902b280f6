-- Shared prelude, prepended to put.lua and delete.lua when they are loaded.

-- The part of key that Redis Cluster hashes: its hash tag, or all of it.
-- A retrieval-cache key listed in a document's l2 set is deleted only if
-- it has the kb's tag: one in another slot (written before cache keys
-- carried it) is unreachable anyway, and on a cluster a script may not
-- touch it.
local function hash_tag(key)
  local open = string.find(key, '{', 1, true)
  if open then
    local close = string.find(key, '}', open + 1, true)
    if close and close > open + 1 then
      return string.sub(key, open + 1, close - 1)
    end
  end
  return key
end

-- Delete the retrieval-cache entries listed in l2 (a document's set) that
-- share the kb's hash tag, and the set.
local function drop_cached(l2, tag)
  for _, key in ipairs(redis.call('SMEMBERS', l2)) do
    if hash_tag(key) == tag then redis.call('DEL', key) end
  end
  redis.call('DEL', l2)
end

