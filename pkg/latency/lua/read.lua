-- Fetch the slots of each series that overlap the last `window`: the
-- current slot, partly filled, back to the one holding now - window. The
-- caller adds them up: that is cheaper in Go than in Redis's Lua.
--
-- KEYS     per series, its key base (as in flush.lua)
-- ARGV[1]  now, ms; 0 = Redis's clock
-- ARGV[2]  slot length, ms
-- ARGV[3]  window, ms
-- Returns {now ms, start of the oldest slot read ms, then per series in
-- KEYS order: an array of its slots (nil where none was written)}.
local now = now_ms(ARGV[1])
local slot_ms = tonumber(ARGV[2])
local first = math.floor((now - tonumber(ARGV[3])) / slot_ms)
local last = math.floor(now / slot_ms)
local reply = {now, first * slot_ms}
local keys = {}
for i = 1, #KEYS do
  for s = first, last do
    keys[s - first + 1] = KEYS[i] .. string.format('%d', s)
  end
  reply[2 + i] = redis.call('MGET', unpack(keys))
end
return reply
