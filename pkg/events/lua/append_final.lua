-- Appends a request's terminal event unless its stream already holds one
-- among its newest entries, so that readers see exactly one end however
-- many writers race to write it: a retried Finalize, the door, two API
-- instances that both found the workflow gone. Events that must come just
-- before the end (a cached answer's tokens) are appended with it, in the
-- same step, or not at all.
--
-- KEYS[1]  the request's stream
-- ARGV[1]  event type, ARGV[2] its JSON data
-- ARGV[3]  approximate max length, ARGV[4] TTL in milliseconds
-- ARGV[5]  how many of the newest entries to look at
-- ARGV[6]  n, how many terminal event types follow
-- ARGV[7 … 6+n]  the terminal event types
-- ARGV[7+n …]    pairs of type and JSON data to append before the end
--
-- Returns {id, 1} for the terminal entry written, or {id, 0} with the id
-- of the terminal entry already there (and nothing written).
local n = tonumber(ARGV[6])
local terminal = {}
for i = 7, 6 + n do
  terminal[ARGV[i]] = true
end
local newest = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[5])
for _, entry in ipairs(newest) do
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 't' and terminal[fields[i + 1]] then
      return {entry[1], 0}
    end
  end
end
for i = 7 + n, #ARGV, 2 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 't', ARGV[i], 'd', ARGV[i + 1])
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 't', ARGV[1], 'd', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {id, 1}
