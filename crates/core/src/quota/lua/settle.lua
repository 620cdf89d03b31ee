-- Settle one reservation: release it and pay the real usage, weekly allowance first, then lots
-- soonest-expiring first; what nothing covers is booked on the allowance. account.lua is
-- prepended.
-- KEYS: 1 meta, 2 reservations, 3 spend buckets, 4 lots, 5 reservation start times,
--       6 rate window charged at reserve time
-- ARGV: 1 now_ms, 2 reservation id, 3 tokens, 4 requests, 5 weekly_tokens, 6 weekly_requests,
--       7 input correction (actual - charged), 8 output correction, 9 account ttl seconds,
--       10 (optional) '1': pay only if the reservation is still held
-- Returns {'load'} when the account is not in Redis (restarted): load it and call again;
-- {'gone'} when ARGV[10] asked for a held reservation and there is none (a retry whose earlier
-- attempt ran but whose answer was lost: it paid already).
-- Otherwise {'ok', allowance_tokens, allowance_requests, lot_id, kind, amount, ...}.
local now = tonumber(ARGV[1])
local m = read_account(KEYS[1])
if not m then return {'load'} end
if ARGV[10] == '1' and redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then return {'gone'} end

release(m, KEYS[2], KEYS[5], ARGV[2])
spend_window(m, KEYS[3], KEYS[2], KEYS[5], now)

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
if wr > 0 then room_r = math.max(0, wr - m.sr - m.xr) end
-- What leases set aside (xa, xr) is not this reservation's to pay from.
local allow_t = take('t', tonumber(ARGV[3]), math.max(0, wt - m.sa - m.xa))
local allow_r = take('r', tonumber(ARGV[4]), room_r)
table.insert(out, 2, allow_t)
table.insert(out, 3, allow_r)

local lot_t, lot_r = 0, 0
for i = 4, #out, 3 do
  if out[i + 1] == 't' then lot_t = lot_t + out[i + 2] else lot_r = lot_r + out[i + 2] end
end
spend_add(m, KEYS[3], now, tonumber(ARGV[9]), allow_t, allow_r, lot_t, lot_r)
write_account(KEYS[1], m)

if redis.call('EXISTS', KEYS[6]) == 1 then
  local fix = {{'i', tonumber(ARGV[7])}, {'o', tonumber(ARGV[8])}}
  for _, f in ipairs(fix) do
    if f[2] ~= 0 then
      local v = redis.call('HINCRBY', KEYS[6], f[1], f[2])
      if v < 0 then redis.call('HSET', KEYS[6], f[1], 0) end
    end
  end
end
return out
