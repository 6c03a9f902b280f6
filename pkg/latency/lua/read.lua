-- Merge the slots of each series that overlap the last `window`: the
-- current slot, partly filled, back to the one holding now - window. Every
-- field is summed across the slots, so the caller gets one histogram per
-- series, whatever the number of slots or of processes that wrote them.
--
-- KEYS     per series, its key base (as in flush.lua)
-- ARGV[1]  now, ms; 0 = Redis's clock
-- ARGV[2]  slot length, ms
-- ARGV[3]  window, ms
-- Returns {now ms, start of the oldest slot read ms, then per series in
-- KEYS order: m, then m field/total pairs}. Totals are integers below
-- 2^53, so Lua's doubles carry them exactly.
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000 + math.floor(t[2] / 1000)
end
local slot_ms = tonumber(ARGV[2])
local first = math.floor((now - tonumber(ARGV[3])) / slot_ms)
local last = math.floor(now / slot_ms)
local reply = {now, first * slot_ms}
for i = 1, #KEYS do
  local total, fields = {}, {}
  for s = first, last do
    local h = redis.call('HGETALL', KEYS[i] .. string.format('%d', s))
    for j = 1, #h, 2 do
      local f = h[j]
      local v = total[f]
      if v == nil then
        fields[#fields + 1] = f
        total[f] = tonumber(h[j + 1])
      else
        total[f] = v + tonumber(h[j + 1])
      end
    end
  end
  reply[#reply + 1] = #fields
  for _, f in ipairs(fields) do
    reply[#reply + 1] = f
    reply[#reply + 1] = total[f]
  end
end
return reply
