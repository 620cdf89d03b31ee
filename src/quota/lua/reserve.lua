-- Reserve quota and per-minute capacity for one request, atomically.
-- KEYS: 1 meta, 2 reservations, 3 spend buckets, 4 lots, 5 rate window (previous minute),
--       6 rate window (current minute)
-- ARGV: 1 now_ms, 2 reservation id, 3 tokens, 4 requests, 5 weekly_tokens, 6 weekly_requests,
--       7 unlimited (0/1), 8 reservation timeout ms, 9 rpm, 10 itpm, 11 otpm,
--       12 input cost, 13 output cost, 14 account ttl seconds
-- Returns {'load'} when the account is not in Redis yet; {'rate', dim, wait_s, views...};
-- {'quota', views...}; {'ok', weekly_total_tokens, max_lot_tier, views...}.
-- views = for each of requests, input, output: limit, remaining, reset_s.
local now = tonumber(ARGV[1])
if redis.call('HEXISTS', KEYS[1], 'loaded') == 0 then return {'load'} end

local rt = tonumber(redis.call('HGET', KEYS[1], 'rt') or '0')
local rr = tonumber(redis.call('HGET', KEYS[1], 'rr') or '0')
local timeout = tonumber(ARGV[8])
local held = redis.call('HGETALL', KEYS[2])
for i = 1, #held, 2 do
  local t, r, at = string.match(held[i + 1], '(%d+),(%d+),(%d+)')
  if now - tonumber(at) > timeout then
    rt = rt - tonumber(t)
    rr = rr - tonumber(r)
    redis.call('HDEL', KEYS[2], held[i])
  end
end
if rt < 0 then rt = 0 end
if rr < 0 then rr = 0 end

local from = math.floor(now / 3600000) - 167
local spend = redis.call('HGETALL', KEYS[3])
local at, ar, lt = 0, 0, 0
for i = 1, #spend, 2 do
  if tonumber(spend[i]) < from then
    redis.call('HDEL', KEYS[3], spend[i])
  else
    local a, b, c = string.match(spend[i + 1], '(%d+),(%d+),(%d+),(%d+)')
    at = at + tonumber(a)
    ar = ar + tonumber(b)
    lt = lt + tonumber(c)
  end
end

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
local prev = redis.call('HMGET', KEYS[5], 'r', 'i', 'o')
local curr = redis.call('HMGET', KEYS[6], 'r', 'i', 'o')
local counts = {}
for d = 1, 3 do
  local p = tonumber(prev[d] or '0') or 0
  local c = tonumber(curr[d] or '0') or 0
  counts[d] = math.floor(p * (60000 - elapsed) / 60000) + c
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
      local p = tonumber(prev[d] or '0') or 0
      local c = tonumber(curr[d] or '0') or 0
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
      local r = {'rate', d, wait}
      for _, v in ipairs(views(false)) do table.insert(r, v) end
      return r
    end
  end
end

local tokens = tonumber(ARGV[3])
local requests = tonumber(ARGV[4])
if ARGV[7] == '0' then
  local wt = tonumber(ARGV[5])
  local avail_t = math.max(0, wt - at) + lot_t - rt
  local short = tokens > avail_t
  local wr = tonumber(ARGV[6])
  if wr > 0 then
    local avail_r = math.max(0, wr - ar) + lot_r - rr
    if requests > avail_r then short = true end
  end
  if short then
    local r = {'quota'}
    for _, v in ipairs(views(false)) do table.insert(r, v) end
    return r
  end
end

redis.call('HSET', KEYS[2], ARGV[2], tokens .. ',' .. requests .. ',' .. now)
redis.call('HSET', KEYS[1], 'rt', rt + tokens, 'rr', rr + requests)
for d = 1, 3 do
  if costs[d] > 0 then redis.call('HINCRBY', KEYS[6], fields[d], costs[d]) end
end
redis.call('EXPIRE', KEYS[6], 150)
local ttl = tonumber(ARGV[14])
for k = 1, 4 do redis.call('EXPIRE', KEYS[k], ttl) end
local r = {'ok', at + lt, max_tier}
for _, v in ipairs(views(true)) do table.insert(r, v) end
return r
