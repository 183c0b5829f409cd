-- Renews the leases a replica holds, and registers those it holds without a lease in Redis (lost while
-- it was cut off, or taken while Redis was down) if they fit the budget now. Never extends a lease past
-- its owner's knowledge: a lease that is gone is registered again only through the budget check.
-- KEYS: 1 generation, 2 recovery window, 3 leases, 4 lease units, 5 totals
-- ARGV: 1 now ('' = Redis TIME), 2 lease time us, 3 recovery window us, 4 slot limit, 5 kv limit,
--       6 channel, 7 the generation the caller knows (0: none), 8 a new generation if none exists,
--       9 number of leases m, then per lease: id, slots, kv
-- Reply: {generation, then per lease: 0 renewed, 1 registered again, 2 does not fit (not held)}
local now = clock(ARGV[1])
local lease_us, recovery_us = tonumber(ARGV[2]), tonumber(ARGV[3])
local slot_limit, kv_limit = tonumber(ARGV[4]), tonumber(ARGV[5])
local gen = generation(KEYS[1], KEYS[2], now, recovery_us, tonumber(ARGV[7]), tonumber(ARGV[8]))
local freed = purge(KEYS[3], KEYS[4], KEYS[5], now)
if freed > 0 then redis.call('PUBLISH', ARGV[6], freed) end
local reply = {gen}
local m = tonumber(ARGV[9])
for i = 1, m do
  local j = 9 + (i - 1) * 3
  local id, s, k = ARGV[j + 1], tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  if redis.call('ZSCORE', KEYS[3], id) then
    redis.call('ZADD', KEYS[3], 'XX', int(now + lease_us), id)
    reply[1 + i] = 0
  elseif fits(KEYS[5], s, k, slot_limit, kv_limit) then
    add_lease(KEYS[3], KEYS[4], KEYS[5], id, s, k, now + lease_us)
    reply[1 + i] = 1
  else
    reply[1 + i] = 2
  end
end
if m > 0 then touch(KEYS[3], KEYS[4], KEYS[5], lease_us) end
return reply
