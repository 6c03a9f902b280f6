-- Reclaim expired permits and hand free ones to waiters. Workers run it
-- periodically so that a crashed holder's slot is not idle until someone
-- releases.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] default permit limit
-- ARGV[2] lease ms
-- ARGV[3] liveness key prefix
-- ARGV[4…] the group's arguments (lib.lua group_args)
-- Returns {ms expired permits of this pool were held, since the last pump
-- claimed it (lib.lua expire_permits), then the pool, id pairs granted a
-- permit, in this pool or another of its group; the caller must notify
-- them}.
group_args(4)
local now = now_ms()
expire_permits(now)
local expired = tonumber(redis.call('HGET', K.stats, 'expired_held_ms') or '0')
if expired > 0 then redis.call('HDEL', K.stats, 'expired_held_ms') end
local reply = {expired}
for _, g in ipairs(pump(pool_limit(ARGV[1]), tonumber(ARGV[2]), ARGV[3], now)) do
  reply[#reply + 1] = g
end
return reply
