-- How many queued entries of the group a request would wait behind: those
-- whose tags are below its place's, the place it reserved at the door (tag
-- > 0), else the one it would get now (start = max(V, its tenant's F_t),
-- plus its charge, place() less the credit, so the count errs long). Changes
-- nothing. The door asks it before it starts a workflow that could only
-- time out in the queue: a request of a heavy tier joins ahead of a light
-- tier's backlog, and the whole queue is not its wait.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] tenant
-- ARGV[2] weight (> 0)
-- ARGV[3] cost (> 0)
-- ARGV[4] the place's tag, reserved at the door (0: none)
-- Returns the count.
local tenant, weight, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local tag = tonumber(ARGV[4] or '0')
if tag <= 0 then
  local charge = math.max(1, math.floor(ticks(cost, weight) * expected(tenant) / 1000 + 0.5))
  tag = math.max(vtime(), tonumber(redis.call('HGET', G.finish, tenant) or '0')) + charge
end
return below(tag)
