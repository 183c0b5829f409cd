-- What the shared capacity holds now, after removing expired leases, with the totals recomputed from
-- the leases themselves (they must agree).
-- KEYS: 1 leases, 2 lease units, 3 totals
-- ARGV: 1 now ('' = Redis TIME), 2 channel
-- Reply: {used slots, used kv, leases, sum of lease slots, sum of lease kv}
local now = clock(ARGV[1])
local freed = purge(KEYS[1], KEYS[2], KEYS[3], now)
if freed > 0 then redis.call('PUBLISH', ARGV[2], freed) end
local us, uk = used_now(KEYS[3])
local n, ss, sk = 0, 0, 0
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local s, k = pair(all[i + 1])
  n = n + 1
  ss = ss + s
  sk = sk + k
end
return {us, uk, n, ss, sk}
