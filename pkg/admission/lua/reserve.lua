-- Reserve a place in the fair order for a request that waits at the door
-- (the API's waiting room) before its workflow starts: the tag enqueue
-- would give it now, F_t moved past it and its tenant's credit spent, as
-- if it had queued. The tenant's later requests then queue after it, so
-- the door's crowd and the queue are one order on one clock: without it, a
-- tenant whose requests reach the queue one at a time is tagged from V
-- each time, like a tenant that asked nothing. The request takes its
-- place when it queues (enqueue.lua ARGV[14]) or gives it back
-- (unreserve.lua); a place neither taken nor given back lapses after ttl.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] tenant
-- ARGV[2] weight (> 0)
-- ARGV[3] cost (> 0)
-- ARGV[4] ttl ms: how long the place may wait at the door
-- Returns {tag, ahead, charge, shift}: the place's tag, how many queued
-- entries of the group are ahead of it, the ticks it was charged (its
-- entry's charge when the request takes it), and its tenant's shift now
-- (lib.lua KEYS[21]), from which the place moves with the tenant's
-- charges until it is taken.
local tenant, weight, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local tag, charge = place(tenant, cost, weight)
reserve_count(tenant, 1, tonumber(ARGV[4]))
return {tag, below(tag), charge, tonumber(redis.call('HGET', G.shift, tenant) or '0')}
