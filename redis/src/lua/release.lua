-- Gives back leases and unused rate tokens. Idempotent for leases: an id that is not held (released
-- before, expired, lost with Redis' state) frees nothing.
-- KEYS: 1 leases, 2 lease units, 3 totals, 4.. one bucket per refund
-- ARGV: 1 now ('' = Redis TIME), 2 channel, 3 number of lease ids m, 4..3+m the ids, then per refund: a, b, n
-- Reply: the number of leases freed.
local now = clock(ARGV[1])
local m = tonumber(ARGV[3])
local freed = 0
for i = 1, m do
  freed = freed + drop_lease(KEYS[1], KEYS[2], KEYS[3], ARGV[3 + i])
end
for i = 1, #KEYS - 3 do
  local j = 3 + m + (i - 1) * 3
  local a, b, n = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3])
  local d = debt(KEYS[3 + i], now, a)
  if d > 0 then store_debt(KEYS[3 + i], now, a, math.max(d - n * b, 0)) end
end
if freed > 0 then redis.call('PUBLISH', ARGV[2], freed) end
return freed
