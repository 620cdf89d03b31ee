-- Prepended to reserve.lua and settle.lua (a Redis script cannot call another): one account's
-- state, read with one HMGET and written back with one HSET, because each redis.call costs
-- server time on every request.
--
-- Meta hash fields: loaded; rt, rr = tokens and requests held by open reservations;
-- sa, sr, sl = allowance tokens, allowance requests and lot tokens spent in the rolling week;
-- so = the oldest spend bucket's hour (absent: no bucket); v = 2 once those sums are built;
-- x = when the keys' expiry was last pushed back (ms); ft, fr = tokens and requests that the
-- instances' leases hold unused (lease.lua), so a refused reservation knows whether waiting for
-- the leases to come back can help (the account is then drained: dr = until when, ms).
--
-- The week's spend is kept as running sums so a call does not scan up to 168 hourly buckets
-- (two scans per request, growing with the account's age over the week). The buckets are
-- scanned only when the oldest one leaves the window, at most once an hour, or when the sums
-- were never built (an account written by an earlier version of these scripts).
-- Reservations are a hash id -> "tokens,requests,at_ms" plus a sorted set id -> at_ms, so the
-- stale ones are found by score instead of by reading every open reservation. An instance's
-- lease is one of them, id "L:<instance>", value "tokens,requests,at_ms,free_tokens,free_requests".
-- Gateways sharing one Redis must run the same version of these scripts: an earlier version
-- would book spend without updating the sums. Keys left by one are carried over (v absent).

local HOUR_MS = 3600000

-- The account's meta hash, or nil when the account is not in Redis.
local function read_account(meta)
  local f = redis.call('HMGET', meta, 'loaded', 'v', 'sa', 'sr', 'sl', 'so', 'rt', 'rr', 'x',
    'ft', 'fr', 'dr')
  if not f[1] then return nil end
  return {
    v = f[2],
    sa = tonumber(f[3] or '0'), sr = tonumber(f[4] or '0'), sl = tonumber(f[5] or '0'),
    so = f[6] and tonumber(f[6]), had_so = f[6] ~= false and f[6] ~= nil,
    rt = tonumber(f[7] or '0'), rr = tonumber(f[8] or '0'),
    x = tonumber(f[9] or '0'),
    ft = tonumber(f[10] or '0'), fr = tonumber(f[11] or '0'),
    dr = tonumber(f[12] or '0') or 0,
  }
end

local function write_account(meta, m)
  if m.so then
    redis.call('HSET', meta, 'v', 2, 'sa', m.sa, 'sr', m.sr, 'sl', m.sl, 'rt', m.rt, 'rr', m.rr,
      'x', m.x, 'ft', m.ft, 'fr', m.fr, 'so', m.so)
  else
    redis.call('HSET', meta, 'v', 2, 'sa', m.sa, 'sr', m.sr, 'sl', m.sl, 'rt', m.rt, 'rr', m.rr,
      'x', m.x, 'ft', m.ft, 'fr', m.fr)
    if m.had_so then redis.call('HDEL', meta, 'so') end
  end
end

-- Brings the week's sums up to `now` (see above); true when they were rebuilt.
local function spend_window(m, buckets, held, held_at, now)
  local from = math.floor(now / HOUR_MS) - 167
  if m.v == '2' and (not m.so or m.so >= from) then return false end
  if m.v ~= '2' then
    -- Written by an earlier version: index its open reservations by start time, once.
    local open = redis.call('HGETALL', held)
    for i = 1, #open, 2 do
      local at = string.match(open[i + 1], '%d+,%d+,(%d+)')
      if at then redis.call('ZADD', held_at, at, open[i]) end
    end
  end
  local spend = redis.call('HGETALL', buckets)
  m.sa, m.sr, m.sl, m.so, m.v = 0, 0, 0, nil, '2'
  for i = 1, #spend, 2 do
    local hour = tonumber(spend[i])
    if hour < from then
      redis.call('HDEL', buckets, spend[i])
    else
      local a, r, l = string.match(spend[i + 1], '(%d+),(%d+),(%d+),')
      m.sa = m.sa + tonumber(a)
      m.sr = m.sr + tonumber(r)
      m.sl = m.sl + tonumber(l)
      if not m.so or hour < m.so then m.so = hour end
    end
  end
  return true
end

-- Books what one settlement paid into the current hour's bucket and into the sums. A bucket
-- hash created here gets the account's expiry.
local function spend_add(m, buckets, now, ttl, allow_t, allow_r, lot_t, lot_r)
  local hour = math.floor(now / HOUR_MS)
  local cur = redis.call('HGET', buckets, hour)
  local a, b, c, d = 0, 0, 0, 0
  if cur then
    local x1, x2, x3, x4 = string.match(cur, '(%d+),(%d+),(%d+),(%d+)')
    a, b, c, d = tonumber(x1), tonumber(x2), tonumber(x3), tonumber(x4)
  end
  redis.call('HSET', buckets, hour, (a + allow_t) .. ',' .. (b + allow_r) .. ',' .. (c + lot_t) .. ',' .. (d + lot_r))
  if not cur then redis.call('EXPIRE', buckets, ttl) end
  m.sa = m.sa + allow_t
  m.sr = m.sr + allow_r
  m.sl = m.sl + lot_t
  if not m.so then m.so = hour end
end

-- Releases the reservation (or lease) `id`, if it is still held.
local function release(m, held, held_at, id)
  local h = redis.call('HGET', held, id)
  redis.call('ZREM', held_at, id)
  if not h then return end
  local t, r, _, ft, fr = string.match(h, '(%d+),(%d+),(%d+),?(%d*),?(%d*)')
  m.rt = math.max(0, m.rt - tonumber(t))
  m.rr = math.max(0, m.rr - tonumber(r))
  if ft and ft ~= '' then
    m.ft = math.max(0, m.ft - tonumber(ft))
    m.fr = math.max(0, m.fr - tonumber(fr))
  end
  redis.call('HDEL', held, id)
end
