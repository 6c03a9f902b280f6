-- Shared prelude, prepended to flush.lua and read.lua when they are loaded.

-- now_ms is the caller's clock if it passed one (tests do), else Redis's:
-- every process then agrees on the slot numbers whatever its own clock.
local function now_ms(arg)
  local now = tonumber(arg)
  if now == 0 then
    local t = redis.call('TIME')
    now = t[1] * 1000 + math.floor(t[2] / 1000)
  end
  return now
end

