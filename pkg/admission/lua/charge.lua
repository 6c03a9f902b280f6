-- Charge a streaming request's tenant for the output it has produced:
-- pay as you go (lib.lua, order.lua). The stream's keep-alive calls it with the
-- cost of all the output so far; the script charges what that is beyond
-- what the request's streaming was already charged, so a call repeated
-- (a retried round trip) or made by a resumed attempt that counts the
-- earlier attempt's tokens too never charges a token twice. The charge
-- advances the tenant's F_t and moves its waiting entries and places
-- (order.lua advance); it frees no permit, so nobody is granted. A request
-- holding no permit, or whose entry was charged its bound up front,
-- is left alone: its release settles it.
-- KEYS   the pool's and its group's keys in lib.lua order
-- ARGV[1] request id
-- ARGV[2] the cost of its output so far, in all (>= 0; admission.TokenCost
--         of its output tokens, each weighted admission.output_token_weight)
-- Returns the ticks charged now (0: nothing new, or nothing to charge).
local id, cost = ARGV[1], tonumber(ARGV[2])
local v = redis.call('HGET', K.charged, id)
if not v or not redis.call('ZSCORE', K.permits, id) then return 0 end
local t, w, placed = read_charged(v)
if not placed then return 0 end
local delta = span(cost, w) - (t - placed)
if delta <= 0 then return 0 end
local _, tenant = split(redis.call('HGET', K.grants, id) or '')
if not tenant then return 0 end
redis.call('HSET', K.charged, id, charged_value(t + delta, w, placed))
advance(tenant, delta)
return delta
