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
-- ARGV[5] the ticks the place was charged (reserve.lua; 0: a place
--         reserved before they were returned, charged cost/weight)
-- ARGV[6] the tenant's shift when the place was reserved (reserve.lua):
--         the place has moved by the tenant's charges since
-- Returns 1.
local tenant, tag = ARGV[1], tonumber(ARGV[2])
local charge = tonumber(ARGV[5] or '0')
if charge <= 0 then charge = ticks(tonumber(ARGV[4]), tonumber(ARGV[3])) end
reserve_count(tenant, -1)
local moved = tonumber(redis.call('HGET', G.shift, tenant) or '0') - tonumber(ARGV[6] or '0')
if moved > 0 then tag = tag + moved end
local f = tonumber(redis.call('HGET', G.finish, tenant) or '0')
if f == tag then
  redis.call('HSET', G.finish, tenant, math.max(vtime(), tag - charge))
end
leave_if_idle(tenant)
return 1
