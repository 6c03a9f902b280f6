-- Store new revisions of documents in a knowledge base and bump its
-- version once, all at once: a worker that reads the kb sees either none
-- or all of the batch. A document whose revision is already current is
-- left alone (re-ingesting the same content changes nothing, not even the
-- version).
--
-- A revision is content-addressed and immutable; the one it replaces is
-- kept for a grace period so that requests still holding its chunk ids
-- can resolve them. Retrieval-cache entries that contained a replaced
-- document are deleted (their keys are listed in the document's l2 set);
-- all of the kb's older entries are already unreachable, since cache keys
-- carry the version.
--
-- Key names are built here from ARGV[1] for the revisions being retired,
-- and taken from l2 sets for the cache entries: all of them share the
-- kb's hash tag, so on Redis Cluster they are in the slot of the declared
-- keys, as a script requires (a listed entry of another tag is left to
-- expire; see tag.lua). The set of its owner's kb names is in a slot of
-- its own: the caller adds the name before this runs.
--
-- KEYS[1] version   KEYS[2] docs (id -> rev)   KEYS[3] info (id -> JSON)
-- KEYS[4] log (zset id -> version of its last change)
-- KEYS[5] model
-- KEYS[6] epoch: set when the version counter starts (a kb written into a
-- Redis that restarted empty counts from 1 again, in a new epoch)
-- KEYS[7] usage (hash: bytes, what its documents store, for the owner's
-- ingestion quota; memory, what they take loaded in a worker's memory;
-- documents are docs' length; chunks, their total)
-- KEYS[8] ids (the docs' ids for reads in pages; see index.lua)
-- KEYS[8+i] the new revision key of document i
-- ARGV[1] the kb's key prefix ("<prefix>kb:{<name>}:")
-- ARGV[2] kb name (without its owner), for errors   ARGV[3] embedder model
-- ARGV[4] grace ms
-- ARGV[5] the most memory the kb may need (0: no limit)
-- ARGV[6] n, then per document: id, rev, info JSON (with its bytes,
-- memory_bytes and chunks), meta JSON, vectors
-- Returns {version, changed_1, ..., changed_n} (1 changed, 0 unchanged);
-- an error "MODEL ..." when the kb is embedded by another model, or
-- "TOOLARGE <memory> <limit>" when the batch would make the kb need more
-- memory than the limit (a batch that shrinks the kb is always taken).
local kp, name, model, grace = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local max_memory = tonumber(ARGV[5])
local n = tonumber(ARGV[6])
local tag = hash_tag(KEYS[1])
ensure_index(KEYS[2], KEYS[3], KEYS[8], KEYS[7])

local function field(info, f)
  return info and cjson.decode(info)[f] or 0
end

local current = redis.call('GET', KEYS[5])
if current and current ~= model then
  return redis.error_reply('MODEL knowledge base ' .. name .. ' is embedded with ' .. current .. ', not ' .. model)
end

if max_memory > 0 then
  local grown = 0
  for i = 1, n do
    local a = 6 + (i - 1) * 5
    local id = ARGV[a + 1]
    if redis.call('HGET', KEYS[2], id) ~= ARGV[a + 2] then
      grown = grown + field(ARGV[a + 3], 'memory_bytes') - field(redis.call('HGET', KEYS[3], id), 'memory_bytes')
    end
  end
  local need = tonumber(redis.call('HGET', KEYS[7], 'memory') or '0') + grown
  if grown > 0 and need > max_memory then
    return redis.error_reply(string.format('TOOLARGE %d %d', need, max_memory))
  end
end

local changed, any = {}, false
for i = 1, n do
  local a = 6 + (i - 1) * 5
  local id, rev = ARGV[a + 1], ARGV[a + 2]
  local old = redis.call('HGET', KEYS[2], id)
  if old == rev then
    changed[i] = 0
  else
    changed[i] = 1
    any = true
    redis.call('HSET', KEYS[8 + i], 'meta', ARGV[a + 4], 'vecs', ARGV[a + 5])
    redis.call('HSET', KEYS[2], id, rev)
    redis.call('ZADD', KEYS[8], 0, id)
    local before = redis.call('HGET', KEYS[3], id)
    for _, f in ipairs({'bytes', 'memory'}) do
      local from = f == 'memory' and 'memory_bytes' or f
      local grown = field(ARGV[a + 3], from) - field(before, from)
      if grown ~= 0 then redis.call('HINCRBY', KEYS[7], f, string.format('%d', grown)) end
    end
    local more = field(ARGV[a + 3], 'chunks') - chunks_of(before)
    if more ~= 0 then redis.call('HINCRBY', KEYS[7], 'chunks', more) end
    redis.call('HSET', KEYS[3], id, ARGV[a + 3])
    if old then
      redis.call('PEXPIRE', kp .. 'rev:' .. id .. ':' .. old, grace)
      drop_cached(kp .. 'l2doc:' .. id, tag)
    end
  end
end

if not any then
  return {tonumber(redis.call('GET', KEYS[1]) or '0'), unpack(changed)}
end
local version = redis.call('INCR', KEYS[1])
if version == 1 or redis.call('EXISTS', KEYS[6]) == 0 then
  local t = redis.call('TIME')
  redis.call('SET', KEYS[6], t[1] .. '.' .. t[2])
end
for i = 1, n do
  if changed[i] == 1 then
    redis.call('ZADD', KEYS[4], version, ARGV[6 + (i - 1) * 5 + 1])
  end
end
if not current then redis.call('SET', KEYS[5], model) end
return {version, unpack(changed)}
