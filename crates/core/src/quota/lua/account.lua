-- Prepended to reserve.lua and settle.lua (a Redis script cannot call another): one account's
-- state, read with one HMGET and written back with one HSET, because each redis.call costs
-- server time on every request.
--
-- Meta hash fields: loaded; rt, rr = tokens and requests held by open reservations;
-- sa, sr, sl = allowance tokens, allowance requests and lot tokens spent in the rolling week;
-- so = the oldest spend bucket's hour (absent: no bucket); v = 2 once those sums are built;
-- x = when the keys' expiry was last pushed back (ms); ft, fr = tokens and requests that the
-- instances' leases hold unused (lease.lua), so a refused reservation knows whether waiting for
-- the leases to come back can help (the account is then drained: dr = until when, ms);
-- xa, xr = tokens and requests of the weekly allowance that leases have set aside (lease.lua):
-- counted as spent for everyone else, so what a set-aside lease settles is known to be paid by
-- the allowance as soon as it is settled; it is booked into sa, sr at the lease's next renewal;
-- bh, bv = the current hour's spend bucket (hour, "at,ar,lt,lr"), kept here rather than in the
-- buckets hash so paying costs no command of its own: it is added to the hash's bucket of that
-- hour when the hour changes.
--
-- The week's spend is kept as running sums so a call does not scan up to 168 hourly buckets
-- (two scans per request, growing with the account's age over the week). The buckets are
-- scanned only when the oldest one leaves the window, at most once an hour, or when the sums
-- were never built (an account written by an earlier version of these scripts).
-- Reservations are a hash id -> "tokens,requests,at_ms" plus a sorted set id -> at_ms, so the
-- stale ones are found by score instead of by reading every open reservation. An instance's
-- lease is one of them, id "L:<instance>", value
-- "tokens,requests,at_ms,free_tokens,free_requests,aside": aside 1 = its tokens and requests are
-- set aside from the allowance (counted in xa, xr instead of rt, rr).
-- Gateways sharing one Redis must run the same version of these scripts: an earlier version
-- would book spend without updating the sums. Keys left by one are carried over (v absent).

local HOUR_MS = 3600000

-- The account's lots still running with something left, soonest-expiring first; expired ones
-- are dropped from the hash (`key`) as they are found.
local function active_lots(key, now)
  local active = {}
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local kind, rem, exp, tier = string.match(all[i + 1], '(%a),(%d+),(%d+),(%-?%d+)')
    if tonumber(exp) <= now then
      redis.call('HDEL', key, all[i])
    elseif tonumber(rem) > 0 then
      table.insert(active, {id = all[i], kind = kind, rem = tonumber(rem), exp = tonumber(exp), tier = tier})
    end
  end
  table.sort(active, function(a, b) return a.exp < b.exp end)
  return active
end

-- The highest tier among `lots` with something left (-1: none), for the tier hint.
local function top_tier(lots)
  local top = -1
  for _, lot in ipairs(lots) do
    if lot.rem > 0 and tonumber(lot.tier) > top then top = tonumber(lot.tier) end
  end
  return top
end

-- The account's meta hash, or nil when the account is not in Redis.
local function read_account(meta)
  local f = redis.call('HMGET', meta, 'loaded', 'v', 'sa', 'sr', 'sl', 'so', 'rt', 'rr', 'x',
    'ft', 'fr', 'dr', 'bh', 'bv', 'xa', 'xr')
  if not f[1] then return nil end
  local bv = nil
  if f[14] then
    local a, b, c, d = string.match(f[14], '(%d+),(%d+),(%d+),(%d+)')
    bv = {tonumber(a), tonumber(b), tonumber(c), tonumber(d)}
  end
  return {
    bh = f[13] and tonumber(f[13]), bv = bv,
    v = f[2],
    sa = tonumber(f[3] or '0'), sr = tonumber(f[4] or '0'), sl = tonumber(f[5] or '0'),
    so = f[6] and tonumber(f[6]), had_so = f[6] ~= false and f[6] ~= nil,
    rt = tonumber(f[7] or '0'), rr = tonumber(f[8] or '0'),
    x = tonumber(f[9] or '0'),
    ft = tonumber(f[10] or '0'), fr = tonumber(f[11] or '0'),
    dr = tonumber(f[12] or '0') or 0,
    xa = tonumber(f[15] or '0'), xr = tonumber(f[16] or '0'),
  }
end

local function write_account(meta, m)
  local f = {'v', 2, 'sa', m.sa, 'sr', m.sr, 'sl', m.sl, 'rt', m.rt, 'rr', m.rr, 'x', m.x,
    'ft', m.ft, 'fr', m.fr, 'xa', m.xa, 'xr', m.xr}
  if m.so then
    table.insert(f, 'so'); table.insert(f, m.so)
  end
  if m.bh then
    table.insert(f, 'bh'); table.insert(f, m.bh)
    table.insert(f, 'bv'); table.insert(f, table.concat(m.bv, ','))
  end
  redis.call('HSET', meta, unpack(f))
  if m.had_so and not m.so then redis.call('HDEL', meta, 'so') end
  if m.drop_b then redis.call('HDEL', meta, 'bh', 'bv') end
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
  if m.bh and m.bh >= from then
    m.sa = m.sa + m.bv[1]
    m.sr = m.sr + m.bv[2]
    m.sl = m.sl + m.bv[3]
    if not m.so or m.bh < m.so then m.so = m.bh end
  elseif m.bh then
    -- Spent more than a week ago: out of the window (write_account deletes it).
    m.bh, m.bv, m.drop_b = nil, nil, true
  end
  return true
end

-- Adds the meta hash's bucket (bh, bv) to the buckets hash's bucket of its hour. A bucket hash
-- created here gets the account's expiry.
local function flush_bucket(m, buckets, ttl)
  local cur = redis.call('HGET', buckets, m.bh)
  local a, b, c, d = 0, 0, 0, 0
  if cur then
    local x1, x2, x3, x4 = string.match(cur, '(%d+),(%d+),(%d+),(%d+)')
    a, b, c, d = tonumber(x1), tonumber(x2), tonumber(x3), tonumber(x4)
  end
  local v = m.bv
  redis.call('HSET', buckets, m.bh, (a + v[1]) .. ',' .. (b + v[2]) .. ',' .. (c + v[3]) .. ',' .. (d + v[4]))
  if not cur then redis.call('EXPIRE', buckets, ttl) end
end

-- Books what one settlement paid into the current hour's bucket (in the meta hash, see above)
-- and into the sums.
local function spend_add(m, buckets, now, ttl, allow_t, allow_r, lot_t, lot_r)
  local hour = math.floor(now / HOUR_MS)
  if m.bh ~= hour then
    if m.bh then flush_bucket(m, buckets, ttl) end
    m.bh, m.bv = hour, {0, 0, 0, 0}
  end
  m.bv = {m.bv[1] + allow_t, m.bv[2] + allow_r, m.bv[3] + lot_t, m.bv[4] + lot_r}
  m.sa = m.sa + allow_t
  m.sr = m.sr + allow_r
  m.sl = m.sl + lot_t
  if not m.so then m.so = hour end
end

-- Takes what one reservation or lease entry `h` holds off the account's sums (held or set
-- aside, and for a lease also held unused).
local function unhold(m, h)
  local t, r, _, ft, fr, aside = string.match(h, '(%d+),(%d+),(%d+),?(%d*),?(%d*),?(%d*)')
  if aside == '1' then
    m.xa = math.max(0, m.xa - tonumber(t))
    m.xr = math.max(0, m.xr - tonumber(r))
  else
    m.rt = math.max(0, m.rt - tonumber(t))
    m.rr = math.max(0, m.rr - tonumber(r))
  end
  if ft and ft ~= '' then
    m.ft = math.max(0, m.ft - tonumber(ft))
    m.fr = math.max(0, m.fr - tonumber(fr))
  end
end

-- Releases the reservation (or lease) `id`, if it is still held.
local function release(m, held, held_at, id)
  local h = redis.call('HGET', held, id)
  redis.call('ZREM', held_at, id)
  if not h then return end
  unhold(m, h)
  redis.call('HDEL', held, id)
end

-- Standing grants on one scope's per-minute windows (lease.rs, `Grant`): a hash, one field per
-- instance, each "from,to,r,i,o": that instance may admit r requests, i input and o output
-- tokens in each minute of [from, to) without asking Redis, so every count of those minutes
-- adds them, as it adds a chunk counted in the minute's window. Returns the sums for the
-- minutes m - 1, m and m + 1 ({r, i, o} each) and whether any grant covers m + 1 (a lease then
-- holds part of the next minute's capacity, which this minute's count adds and which it gives
-- back when its grant ends: waiting for it can help; an ended grant keeps only minutes up to m).
local function grant_counts(key, m)
  local sums = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}}
  local held = false
  for _, v in ipairs(redis.call('HVALS', key)) do
    local from, to, r, i, o = string.match(v, '(%-?%d+),(%-?%d+),(%d+),(%d+),(%d+)')
    if from then
      from, to = tonumber(from), tonumber(to)
      local dims = {tonumber(r), tonumber(i), tonumber(o)}
      for k = 1, 3 do
        local x = m - 2 + k
        if from <= x and x < to then
          for d = 1, 3 do sums[k][d] = sums[k][d] + dims[d] end
          if k == 3 then held = true end
        end
      end
    end
  end
  return sums, held
end
