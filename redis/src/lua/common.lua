-- Helpers shared by every kvgate-redis script (prepended to each one).
--
-- Numbers are Lua doubles: every integer these scripts compute stays below 2^52 (the crate checks the
-- configuration for it), so they are exact. Integers go back to Redis through `int`, never through Lua's
-- own number-to-string conversion, which would print 1.7e+15 for a microsecond timestamp.

local function int(x)
  return string.format('%d', x)
end

-- Whether this script runs on the caller's time (`clock` sets it).
local manual_time = false

-- A key's idle expiry of `ms` milliseconds, which runs on Redis' clock. On the caller's time, which need
-- not keep pace with Redis' clock, at least an hour: the scripts compare the deadlines stored in the keys
-- with the caller's time, so a key that outlives its deadline is read as expired, and one that vanished
-- early would end a bucket's debt, a lease or a recovery window before the caller's clock said so.
local function idle_ms(ms)
  if manual_time then return math.max(ms, 3600000) end
  return ms
end

-- The time of this decision in microseconds: the caller's (tests) or Redis' own clock, so that the
-- replicas' clocks never matter.
local function clock(arg)
  manual_time = arg ~= ''
  if manual_time then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor(p / q) and the remainder, exactly, for integers 0 <= p < 2^52 and 1 <= q < 2^52.
local function divmod(p, q)
  local d = math.floor(p / q)
  local r = p - d * q
  while r < 0 do d = d - 1; r = r + q end
  while r >= q do d = d + 1; r = r - q end
  return d, r
end

-- "x:y" -> x, y
local function pair(s)
  local sep = string.find(s, ':', 1, true)
  return tonumber(string.sub(s, 1, sep - 1)), tonumber(string.sub(s, sep + 1))
end

-- GCRA. A bucket refills at a/b tokens per microsecond up to `burst`. Its state is the theoretical
-- arrival time `tat`, kept as whole microseconds and a remainder in 1/a microsecond ("tat_us:frac").
-- The debt at `now` is how far `tat` lies ahead of `now`, in units of 1/a microsecond: 0 for a full
-- bucket (or a missing key), burst*b for an empty one. Taking n tokens adds n*b; time pays a per
-- microsecond. Every quantity is an integer, so nothing drifts.
local function debt(key, now, a)
  local v = redis.call('GET', key)
  if not v then return 0 end
  local tat, frac = pair(v)
  if tat < now then return 0 end
  return (tat - now) * a + frac
end

-- Stores a debt; a paid-off bucket is deleted (a missing key is a full bucket), and a key expires when
-- its debt would be paid off, so an idle tenant leaves nothing behind (`debt` reads a paid-off key that
-- has not expired yet as a full bucket).
local function store_debt(key, now, a, d)
  if d <= 0 then
    redis.call('DEL', key)
    return
  end
  local us, frac = divmod(d, a)
  redis.call('SET', key, int(now + us) .. ':' .. int(frac), 'PX', int(idle_ms(math.floor(us / 1000) + 2)))
end

-- Whether n tokens fit a bucket with debt d: (true, new debt) or (false, the least whole number of
-- microseconds after which they would).
local function take(d, a, b, burst, n)
  local cost = n * b
  local cap = burst * b
  if d + cost <= cap then return true, d + cost end
  local w, r = divmod(d + cost - cap, a)
  if r > 0 then w = w + 1 end
  return false, w
end

-- Leases: a sorted set id -> expiry (microseconds), a hash id -> "slots:kv", and the totals in a hash
-- (fields slots, kv). Removes one lease; returns 1 if it was held.
local function drop_lease(leases, units, used, id)
  redis.call('ZREM', leases, id)
  local u = redis.call('HGET', units, id)
  if not u then return 0 end
  redis.call('HDEL', units, id)
  local s, k = pair(u)
  redis.call('HINCRBY', used, 'slots', int(-s))
  redis.call('HINCRBY', used, 'kv', int(-k))
  return 1
end

-- Removes leases whose expiry has passed (at most 256 per call; what is left is still counted, which
-- only refuses more, never overcommits). Returns how many were held.
local function purge(leases, units, used, now)
  local freed = 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', int(now), 'LIMIT', 0, 256)) do
    freed = freed + drop_lease(leases, units, used, id)
  end
  return freed
end

local function used_now(used)
  local s = redis.call('HGET', used, 'slots')
  local k = redis.call('HGET', used, 'kv')
  return tonumber(s or '0'), tonumber(k or '0')
end

local function add_lease(leases, units, used, id, s, k, expiry)
  redis.call('ZADD', leases, int(expiry), id)
  redis.call('HSET', units, id, int(s) .. ':' .. int(k))
  redis.call('HINCRBY', used, 'slots', int(s))
  redis.call('HINCRBY', used, 'kv', int(k))
end

-- Lease keys live as long as a lease could: once nobody writes them for that long, every lease in them
-- has expired and they vanish together.
local function touch(leases, units, used, lease_us)
  local ms = int(idle_ms(math.floor(lease_us / 1000) * 2 + 1000))
  redis.call('PEXPIRE', leases, ms)
  redis.call('PEXPIRE', units, ms)
  redis.call('PEXPIRE', used, ms)
end

-- Fits(s, k) under the limits (a negative limit is no limit).
local function fits(used, s, k, slot_limit, kv_limit)
  local us, uk = used_now(used)
  return (slot_limit < 0 or us + s <= slot_limit) and (kv_limit < 0 or uk + k <= kv_limit)
end

-- The generation: a random number (the caller's `candidate`) written when Redis' state began, with
-- that time ("gen:born"). When Redis lost its state (a restart without persistence, a failover to a
-- replica that had not seen the writes), the key is missing and the first script writes a new one. A
-- caller that knew another generation (`known`, 0 for none) was running before: its leases, and
-- probably others', are gone from Redis, so it opens the recovery window (until the new generation's
-- birth plus `recovery_us`), during which only leases that replicas already hold may be registered. A
-- fleet starting fresh knows no generation and opens no window.
local function generation(gen, recovery, now, recovery_us, known, candidate)
  local v = redis.call('GET', gen)
  local g, born
  if v then
    g, born = pair(v)
    redis.call('PEXPIRE', gen, 86400000)
  else
    g, born = candidate, now
    redis.call('SET', gen, int(g) .. ':' .. int(born), 'PX', 86400000)
  end
  if known ~= 0 and known ~= g and recovery_us > 0 and now < born + recovery_us then
    redis.call('SET', recovery, int(born + recovery_us), 'PX', int(idle_ms(math.floor(recovery_us / 1000) + 1000)))
  end
  return g
end

-- Microseconds left in the recovery window (0: none).
local function recovering(recovery, now)
  local v = redis.call('GET', recovery)
  if not v then return 0 end
  local left = tonumber(v) - now
  if left <= 0 then
    redis.call('DEL', recovery)
    return 0
  end
  return left
end
