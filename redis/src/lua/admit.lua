-- One admission decision, all or nothing: a capacity lease, then every rate.
-- KEYS: 1 generation, 2 recovery window, 3 leases, 4 lease units, 5 totals, 6.. one bucket per rate
-- ARGV: 1 now ('' = Redis TIME), 2 mode ('admit' or 'batch'), 3 lease id ('' = no lease), 4 slots,
--       5 kv units, 6 slot limit, 7 kv limit (negative: none), 8 lease time us, 9 recovery window us,
--       10 channel, 11 the generation the caller knows (0: none), 12 a new generation if none exists,
--       then per rate: a, b, burst, n
-- 'admit' takes n of every rate or nothing; 'batch' (the local allowance) takes up to n of each rate
-- and needs no lease. The recovery window holds back new leases only.
-- Reply: {0, generation, taken per rate...} granted; {1, used slots, used kv} no capacity;
--        {2, wait us} rate limited; {3, wait us} recovering.
local now = clock(ARGV[1])
local mode = ARGV[2]
local id = ARGV[3]
local s, k = tonumber(ARGV[4]), tonumber(ARGV[5])
local slot_limit, kv_limit = tonumber(ARGV[6]), tonumber(ARGV[7])
local lease_us, recovery_us = tonumber(ARGV[8]), tonumber(ARGV[9])
local gen = generation(KEYS[1], KEYS[2], now, recovery_us, tonumber(ARGV[11]), tonumber(ARGV[12]))

if id ~= '' then
  local left = recovering(KEYS[2], now)
  if left > 0 then return {3, left} end
  local freed = purge(KEYS[3], KEYS[4], KEYS[5], now)
  if freed > 0 then redis.call('PUBLISH', ARGV[10], freed) end
  if not redis.call('ZSCORE', KEYS[3], id) and not fits(KEYS[5], s, k, slot_limit, kv_limit) then
    local us, uk = used_now(KEYS[5])
    return {1, us, uk}
  end
end

local debts, taken = {}, {}
local wait = 0
for i = 1, #KEYS - 5 do
  local j = 12 + (i - 1) * 4
  local a, b, burst, n = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]), tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  local d = debt(KEYS[5 + i], now, a)
  if mode == 'batch' then
    n = math.min(n, math.floor((burst * b - d) / b))
    if n < 0 then n = 0 end
  end
  local ok, v = take(d, a, b, burst, n)
  if ok then debts[i] = v; taken[i] = n elseif v > wait then wait = v end
end
if wait > 0 then return {2, wait} end

for i = 1, #KEYS - 5 do
  local a = tonumber(ARGV[12 + (i - 1) * 4 + 1])
  if taken[i] > 0 then store_debt(KEYS[5 + i], now, a, debts[i]) end
end
if id ~= '' then
  if redis.call('ZSCORE', KEYS[3], id) then
    redis.call('ZADD', KEYS[3], 'XX', int(now + lease_us), id)
  else
    add_lease(KEYS[3], KEYS[4], KEYS[5], id, s, k, now + lease_us)
  end
  touch(KEYS[3], KEYS[4], KEYS[5], lease_us)
end
local reply = {0, gen}
for i = 1, #taken do reply[2 + i] = taken[i] end
return reply
