-- One page of a knowledge base's description, read atomically: its
-- version, model, document count and chunk total, then up to `limit`
-- documents in id order after `after`, each with the version of its last
-- change. See index.lua for the ids set it reads.
-- KEYS[1] version   KEYS[2] model   KEYS[3] docs   KEYS[4] info
-- KEYS[5] log   KEYS[6] ids   KEYS[7] usage
-- ARGV[1] after: the last id of the previous page ("" = from the first)
-- ARGV[2] limit
-- Returns {version, model, documents, chunks, more (1/0), then per
-- document: info JSON, version of its last change}.
local docs, info, log, ids, usage = KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
-- A kb with no documents (never written, or emptied) has no page to
-- index: a read of it writes nothing, so reads of names that do not
-- exist leave no keys behind.
if redis.call('EXISTS', docs) == 0 then
  return {tonumber(redis.call('GET', KEYS[1]) or '0'), redis.call('GET', KEYS[2]) or '', 0, 0, 0}
end
ensure_index(docs, info, ids, usage)
local limit = tonumber(ARGV[2])
local from = '-'
if ARGV[1] ~= '' then from = '(' .. ARGV[1] end
local page = redis.call('ZRANGE', ids, from, '+', 'BYLEX', 'LIMIT', 0, limit + 1)
local more = 0
if #page > limit then
  more = 1
  page[#page] = nil
end
local out = {
  tonumber(redis.call('GET', KEYS[1]) or '0'),
  redis.call('GET', KEYS[2]) or '',
  redis.call('HLEN', docs),
  tonumber(redis.call('HGET', usage, 'chunks') or '0'),
  more,
}
for _, id in ipairs(page) do
  out[#out + 1] = redis.call('HGET', info, id) or ''
  out[#out + 1] = tonumber(redis.call('ZSCORE', log, id) or '0')
end
return out
