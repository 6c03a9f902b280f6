-- How many queued entries of the group a request would wait behind: those
-- whose tags are below its place's, the place it reserved at the door (tag
-- > 0, moved by what its tenant's streams were charged since, as enqueue
-- will move it), else the one it would get now (start = max(V, its
-- tenant's F_t), plus its charge, place() less the credit, so the count
-- errs long). Entries move later as their tenants' streams are charged,
-- so the count may fall faster than grants alone make it. Changes
-- nothing. The door asks it before it starts a workflow that could only
-- time out in the queue: a request of a heavy tier joins ahead of a light
-- tier's backlog, and the whole queue is not its wait.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] tenant
-- ARGV[2] weight (> 0)
-- ARGV[3] cost (> 0)
-- ARGV[4] the place's tag, reserved at the door (0: none)
-- ARGV[5] the tenant's shift when the place was reserved (reserve.lua)
-- Returns the count.
local tenant, weight, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local tag = tonumber(ARGV[4] or '0')
if tag > 0 then
  local moved = tonumber(redis.call('HGET', G.shift, tenant) or '0') - tonumber(ARGV[5] or '0')
  if moved > 0 then tag = tag + moved end
else
  tag = math.max(vtime(), tonumber(redis.call('HGET', G.finish, tenant) or '0')) + ticks(cost, weight)
end
return below(tag)
