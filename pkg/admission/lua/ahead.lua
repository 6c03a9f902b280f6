-- How many queued entries of the group a new request would wait behind:
-- those whose tags are below the tag it would get (start = max(V, its
-- tenant's F_t), plus cost/weight; credit left out, so the count errs
-- long). Changes nothing. The door asks it before it starts a workflow
-- that could only time out in the queue: a request of a heavy tier joins
-- ahead of a light tier's backlog, and the whole queue is not its wait.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] tenant
-- ARGV[2] weight (> 0)
-- ARGV[3] cost (> 0)
-- Returns the count.
local tenant, weight, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local start = math.max(vtime(), tonumber(redis.call('HGET', G.finish, tenant) or '0'))
local below = '(' .. string.format('%.0f', start + ticks(cost, weight))
local n = 0
for _, q in ipairs(queues()) do
  n = n + redis.call('ZCOUNT', q, '-inf', below)
end
return n
