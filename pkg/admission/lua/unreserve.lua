-- Give back a place reserved at the door (reserve.lua) whose request never
-- queued: it timed out or was cancelled there, or its client left. If it
-- was its tenant's last place (its tag is F_t), F_t goes back to where the
-- place started, so that the tenant's next request is not placed behind
-- what it never got; a tenant left idle forgets F_t and credit.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] tenant
-- ARGV[2] the place's tag
-- ARGV[3] weight (> 0)
-- ARGV[4] cost (> 0)
-- Returns 1.
local tenant, tag = ARGV[1], tonumber(ARGV[2])
reserve_count(tenant, -1)
local f = tonumber(redis.call('HGET', G.finish, tenant) or '0')
if f == tag then
  redis.call('HSET', G.finish, tenant, math.max(vtime(), tag - ticks(tonumber(ARGV[4]), tonumber(ARGV[3]))))
end
if idle(tenant) then
  redis.call('HDEL', G.finish, tenant)
  redis.call('HDEL', G.credit, tenant)
end
return 1
