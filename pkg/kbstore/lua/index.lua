-- Shared prelude, prepended to put.lua, delete.lua and page.lua when they
-- are loaded.

-- A kb keeps, beside its docs hash, the same ids in a sorted set of equal
-- scores (read in id order a page at a time with ZRANGE BYLEX) and its
-- total of chunks in its usage hash, so that a read of its first page
-- costs one page, not the whole kb. A kb written before it had them is
-- indexed once, by the first script that touches it; usage's `indexed`
-- field says that was done.
-- docs, info, ids, usage: the kb's keys of those names.
local function ensure_index(docs, info, ids, usage)
  if redis.call('HGET', usage, 'indexed') == '1' then return end
  redis.call('DEL', ids)
  local chunks = 0
  for _, id in ipairs(redis.call('HKEYS', docs)) do
    redis.call('ZADD', ids, 0, id)
    local raw = redis.call('HGET', info, id)
    if raw then chunks = chunks + (cjson.decode(raw).chunks or 0) end
  end
  redis.call('HSET', usage, 'chunks', chunks, 'indexed', 1)
end

-- The chunks of a document's info JSON (false: none stored).
local function chunks_of(raw)
  if not raw then return 0 end
  return cjson.decode(raw).chunks or 0
end
