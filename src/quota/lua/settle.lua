-- Settle one reservation: release it and pay the real usage, weekly allowance first, then lots
-- soonest-expiring first; what nothing covers is booked on the allowance.
-- KEYS: 1 meta, 2 reservations, 3 spend buckets, 4 lots, 5 rate window charged at reserve time
-- ARGV: 1 now_ms, 2 reservation id, 3 tokens, 4 requests, 5 weekly_tokens, 6 weekly_requests,
--       7 input correction (actual - charged), 8 output correction
-- Returns {'load'} when the account is not in Redis (restarted): load it and call again.
-- Otherwise {'ok', allowance_tokens, allowance_requests, lot_id, kind, amount, ...}.
local now = tonumber(ARGV[1])
if redis.call('HEXISTS', KEYS[1], 'loaded') == 0 then return {'load'} end

local held = redis.call('HGET', KEYS[2], ARGV[2])
if held then
  local t, r = string.match(held, '(%d+),(%d+),')
  local rt = tonumber(redis.call('HGET', KEYS[1], 'rt') or '0') - tonumber(t)
  local rr = tonumber(redis.call('HGET', KEYS[1], 'rr') or '0') - tonumber(r)
  if rt < 0 then rt = 0 end
  if rr < 0 then rr = 0 end
  redis.call('HSET', KEYS[1], 'rt', rt, 'rr', rr)
  redis.call('HDEL', KEYS[2], ARGV[2])
end

local from = math.floor(now / 3600000) - 167
local spend = redis.call('HGETALL', KEYS[3])
local at, ar = 0, 0
for i = 1, #spend, 2 do
  if tonumber(spend[i]) >= from then
    local a, b = string.match(spend[i + 1], '(%d+),(%d+),')
    at = at + tonumber(a)
    ar = ar + tonumber(b)
  end
end

local lots = redis.call('HGETALL', KEYS[4])
local active = {}
for i = 1, #lots, 2 do
  local kind, rem, exp, tier = string.match(lots[i + 1], '(%a),(%d+),(%d+),(%-?%d+)')
  if tonumber(exp) > now and tonumber(rem) > 0 then
    table.insert(active, {id = lots[i], kind = kind, rem = tonumber(rem), exp = tonumber(exp), tier = tier})
  end
end
table.sort(active, function(a, b) return a.exp < b.exp end)

local out = {'ok'}
local function take(kind, amount, room)
  local from_allowance = math.min(amount, room)
  local rest = amount - from_allowance
  for _, lot in ipairs(active) do
    if rest <= 0 then break end
    if lot.kind == kind then
      local n = math.min(rest, lot.rem)
      lot.rem = lot.rem - n
      rest = rest - n
      redis.call('HSET', KEYS[4], lot.id, lot.kind .. ',' .. lot.rem .. ',' .. lot.exp .. ',' .. lot.tier)
      table.insert(out, lot.id); table.insert(out, kind); table.insert(out, n)
    end
  end
  return from_allowance + rest
end

local wt = tonumber(ARGV[5])
local wr = tonumber(ARGV[6])
local room_r = 9007199254740991
if wr > 0 then room_r = math.max(0, wr - ar) end
local allow_t = take('t', tonumber(ARGV[3]), math.max(0, wt - at))
local allow_r = take('r', tonumber(ARGV[4]), room_r)
table.insert(out, 2, allow_t)
table.insert(out, 3, allow_r)

local lot_t, lot_r = 0, 0
for i = 4, #out, 3 do
  if out[i + 1] == 't' then lot_t = lot_t + out[i + 2] else lot_r = lot_r + out[i + 2] end
end
local hour = tostring(math.floor(now / 3600000))
local cur = redis.call('HGET', KEYS[3], hour)
local a, b, c, d = 0, 0, 0, 0
if cur then
  local x1, x2, x3, x4 = string.match(cur, '(%d+),(%d+),(%d+),(%d+)')
  a, b, c, d = tonumber(x1), tonumber(x2), tonumber(x3), tonumber(x4)
end
redis.call('HSET', KEYS[3], hour, (a + allow_t) .. ',' .. (b + allow_r) .. ',' .. (c + lot_t) .. ',' .. (d + lot_r))

if redis.call('EXISTS', KEYS[5]) == 1 then
  local fix = {{'i', tonumber(ARGV[7])}, {'o', tonumber(ARGV[8])}}
  for _, f in ipairs(fix) do
    if f[2] ~= 0 then
      local v = redis.call('HINCRBY', KEYS[5], f[1], f[2])
      if v < 0 then redis.call('HSET', KEYS[5], f[1], 0) end
    end
  end
end
return out
