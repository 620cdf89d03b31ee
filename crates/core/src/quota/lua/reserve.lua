-- Reserve quota and per-minute capacity for one request, atomically. account.lua is prepended.
-- KEYS: 1 meta, 2 reservations, 3 spend buckets, 4 lots, 5 reservation start times,
--       6 rate window (previous minute), 7 rate window (current minute), 8 rate window (next
--       minute: it holds the chunks leases took ahead, counted in this minute's count too,
--       see lease.lua), 9 the leases' standing grants on these windows (account.lua's
--       grant_counts: each minute's count adds them)
-- ARGV: 1 now_ms, 2 reservation id, 3 tokens, 4 requests, 5 weekly_tokens, 6 weekly_requests,
--       7 unlimited (0/1), 8 reservation timeout ms, 9 rpm, 10 itpm, 11 otpm,
--       12 input cost, 13 output cost, 14 account ttl seconds, 15 account id (for KEYS[10])
-- KEYS[10] (optional): the sorted set of accounts holding reservations, scored by the start of
--       the oldest one they may hold; the periodic sweep (sweep.lua) reads it. On a Redis
--       Cluster it lives in another slot than the account: the caller adds the account to it
--       when the reply says this is its first reservation.
-- Returns {'load'} when the account is not in Redis yet; {'rate', dim, wait_s, views...};
-- {'quota', views...}; {'ok', weekly_total_tokens, max_lot_tier, views..., first} where first
-- is 1 when the account held no reservation before this one. A refusal that instances' leases
-- may cause (they hold unused tokens or requests, or unused parts of the window) is
-- {'drain-rate', ...} or {'drain-quota', ...} instead: the account is drained (no instance
-- keeps or takes a lease for DRAIN_MS, lease.lua), so the caller waits for the leases to come
-- back and asks again.
-- views = for each of requests, input, output: limit, remaining, reset_s.
local now = tonumber(ARGV[1])
local m = read_account(KEYS[1])
if not m then return {'load'} end
local DRAIN_MS = 2000

local rebuilt = spend_window(m, KEYS[3], KEYS[2], KEYS[5], now)

-- Reservations older than the timeout (their request died with its instance) are released
-- here, whatever this request's outcome.
local timeout = tonumber(ARGV[8])
local stale = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. (now - timeout))
for _, id in ipairs(stale) do release(m, KEYS[2], KEYS[5], id) end
if rebuilt or #stale > 0 then write_account(KEYS[1], m) end

local lots = redis.call('HGETALL', KEYS[4])
local lot_t, lot_r, max_tier = 0, 0, -1
for i = 1, #lots, 2 do
  local kind, rem, exp, tier = string.match(lots[i + 1], '(%a),(%d+),(%d+),(%-?%d+)')
  rem = tonumber(rem)
  if tonumber(exp) <= now then
    redis.call('HDEL', KEYS[4], lots[i])
  elseif rem > 0 then
    if kind == 't' then lot_t = lot_t + rem else lot_r = lot_r + rem end
    if tonumber(tier) > max_tier then max_tier = tonumber(tier) end
  end
end

local elapsed = now % 60000
local reset = math.ceil((60000 - elapsed) / 1000)
local caps = {tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])}
local costs = {1, tonumber(ARGV[12]), tonumber(ARGV[13])}
local fields = {'r', 'i', 'o'}
local prev = redis.call('HMGET', KEYS[6], 'r', 'i', 'o')
local curr = redis.call('HMGET', KEYS[7], 'r', 'i', 'o', 'L')
local nxt = redis.call('HMGET', KEYS[8], 'r', 'i', 'o', 'L')
local granted, grants_held = grant_counts(KEYS[9], math.floor(now / 60000))
-- Each minute's count: its window plus the grants covering it.
local function count(window, k, d)
  return (tonumber(window[d] or '0') or 0) + granted[k][d]
end
local counts = {}
for d = 1, 3 do
  counts[d] = math.floor(count(prev, 1, d) * (60000 - elapsed) / 60000) + count(curr, 2, d)
    + count(nxt, 3, d)
end
local function views(extra)
  local out = {}
  for d = 1, 3 do
    local rem = caps[d] - counts[d] - (extra and costs[d] or 0)
    if rem < 0 then rem = 0 end
    table.insert(out, caps[d]); table.insert(out, rem); table.insert(out, reset)
  end
  return out
end

for d = 1, 3 do
  local cap = caps[d]
  if cap > 0 then
    local cost = costs[d]
    if cost > cap then cost = cap end
    if counts[d] + cost > cap then
      local p = count(prev, 1, d)
      local c = count(curr, 2, d) + count(nxt, 3, d)
      local need = counts[d] + cost - cap
      local wait_ms
      if p > 0 and need <= math.floor(p * (60000 - elapsed) / 60000) then
        wait_ms = math.ceil(need * 60000 / p)
      else
        wait_ms = 60000 - elapsed
        if c + cost > cap then wait_ms = wait_ms + 30000 end
      end
      local wait = math.ceil(wait_ms / 1000)
      if wait < 1 then wait = 1 end
      local status = 'rate'
      -- Only chunks of this minute and the next can come back (a lease's chunk is used in its
      -- minute only).
      if (tonumber(curr[4] or '0') or 0) + (tonumber(nxt[4] or '0') or 0) > 0
        or grants_held then
        status = 'drain-rate'
        redis.call('HSET', KEYS[1], 'dr', now + DRAIN_MS)
      end
      local r = {status, d, wait}
      for _, v in ipairs(views(false)) do table.insert(r, v) end
      return r
    end
  end
end

local tokens = tonumber(ARGV[3])
local requests = tonumber(ARGV[4])
if ARGV[7] == '0' then
  local wt = tonumber(ARGV[5])
  local avail_t = math.max(0, wt - m.sa - m.xa) + lot_t - m.rt
  local short = tokens > avail_t
  local wr = tonumber(ARGV[6])
  if wr > 0 then
    local avail_r = math.max(0, wr - m.sr - m.xr) + lot_r - m.rr
    if requests > avail_r then short = true end
  end
  if short then
    local status = 'quota'
    if m.ft > 0 or (wr > 0 and m.fr > 0) then
      status = 'drain-quota'
      redis.call('HSET', KEYS[1], 'dr', now + DRAIN_MS)
    end
    local r = {status}
    for _, v in ipairs(views(false)) do table.insert(r, v) end
    return r
  end
end

redis.call('HSET', KEYS[2], ARGV[2], tokens .. ',' .. requests .. ',' .. now)
redis.call('ZADD', KEYS[5], now, ARGV[2])
-- Every key's expiry is pushed back at most once an hour (an EXPIRE costs more server time
-- than most calls here). The two reservation keys vanish when emptied and come back with the
-- next reservation: nothing held before this one means they are new and get theirs now.
local ttl = tonumber(ARGV[14])
if now - m.x >= HOUR_MS then
  m.x = now
  for k = 1, 5 do redis.call('EXPIRE', KEYS[k], ttl) end
elseif m.rr == 0 then
  redis.call('EXPIRE', KEYS[2], ttl)
  redis.call('EXPIRE', KEYS[5], ttl)
end
-- An account holding reservations is always in the sweep's set: it enters with its first one
-- (only the sweep takes it out, when it holds none), so this costs a call only then.
local first = 0
if m.rr == 0 then
  first = 1
  if KEYS[10] then redis.call('ZADD', KEYS[10], 'NX', now, ARGV[15]) end
end
m.rt = m.rt + tokens
m.rr = m.rr + requests
write_account(KEYS[1], m)
for d = 1, 3 do
  if costs[d] > 0 then
    local n = redis.call('HINCRBY', KEYS[7], fields[d], costs[d])
    -- The request count goes up on every reservation: a first count is a new window.
    if d == 1 and n == costs[d] then redis.call('EXPIRE', KEYS[7], 150) end
  end
end
local r = {'ok', m.sa + m.sl, max_tier}
for _, v in ipairs(views(true)) do table.insert(r, v) end
table.insert(r, first)
return r
