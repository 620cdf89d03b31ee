-- Renew one instance's lease on one account, atomically: pay the settlements the instance made
-- against it since its last call (as one sum: the instance splits what was paid back per
-- request, in order), give back what it no longer needs, and carve a fresh share of the
-- account's balance and per-minute windows. account.lua is prepended.
--
-- A lease is a reservation (id ARGV[2]) holding what the instance's admitted requests hold
-- (kept whatever the balance says: they were admitted) plus unused tokens and requests it may
-- admit without asking Redis. A lease never takes more than 1/K of what is left beyond every
-- other reservation and lease, and none at all once that share is smaller than one request:
-- the account is then drained (dr = until when) and every instance reserves each request
-- exactly (reserve.lua), giving its unused share back at its next call.
-- Per-minute windows: a lease's chunk is charged to the current minute's window up front and
-- its unused part given back later, so a window counts at least what was admitted.
--
-- KEYS: 1 meta, 2 reservations, 3 spend buckets, 4 lots, 5 reservation start times,
--       then the per-minute window keys the arguments name by index (1 = KEYS[6])
-- ARGV: 1 now_ms, 2 lease id, 3 weekly_tokens, 4 weekly_requests, 5 unlimited (0/1),
--       6 reservation timeout ms, 7 account ttl seconds, 8 K,
--       9, 10 tokens and requests held by admitted requests, 11, 12 unused tokens and requests,
--       13, 14 tokens and requests asked for on top, 15 the least useful share of tokens,
--       16, 17 tokens and requests settled in all, 18 number of window corrections n,
--       19 number of scopes s,
--       then n corrections: window index, input correction, output correction (actual - charged),
--       then s scopes: previous-minute window index, current-minute window index, caps (r, i, o),
--         index of the window a chunk is given back to (0: none), its unused part (r, i, o), the
--         whole chunk (r, i, o), the chunk asked for (r, i, o)
-- Returns {'load'} when the account is not in Redis; otherwise
-- {mode, tokens granted, requests granted, weekly_total_tokens, max_lot_tier, first,
--  settlements, scopes}: mode 'lease', or 'exact' (drained: the lease now holds only what
-- admitted requests hold); first = 1 when the account held nothing before; settled =
-- {allowance tokens, allowance requests, uncovered tokens, uncovered requests (booked on the
-- allowance too), lot_id, kind, amount, ...}; scopes = for each,
-- {chunk r, i, o, sliding count r, i, o before the chunk}.
local now = tonumber(ARGV[1])
local m = read_account(KEYS[1])
if not m then return {'load'} end
local DRAIN_MS = 2000
local BIG = 9007199254740991
local W = 5

spend_window(m, KEYS[3], KEYS[2], KEYS[5], now)
local stale = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', '(' .. (now - tonumber(ARGV[6])))
for _, id in ipairs(stale) do release(m, KEYS[2], KEYS[5], id) end
local lease_id = ARGV[2]
local had_lease = redis.call('HEXISTS', KEYS[2], lease_id) == 1
release(m, KEYS[2], KEYS[5], lease_id)
local held_nothing = not had_lease and m.rt == 0 and m.rr == 0

local lots = redis.call('HGETALL', KEYS[4])
local active = {}
for i = 1, #lots, 2 do
  local kind, rem, exp, tier = string.match(lots[i + 1], '(%a),(%d+),(%d+),(%-?%d+)')
  if tonumber(exp) <= now then
    redis.call('HDEL', KEYS[4], lots[i])
  elseif tonumber(rem) > 0 then
    table.insert(active, {id = lots[i], kind = kind, rem = tonumber(rem), exp = tonumber(exp), tier = tier})
  end
end
table.sort(active, function(a, b) return a.exp < b.exp end)

-- Settlements: weekly allowance first, then lots soonest-expiring first; what nothing covers is
-- booked on the allowance (as settle.lua).
local wt, wr = tonumber(ARGV[3]), tonumber(ARGV[4])
local paid = {0, 0, 0, 0}
local changed = {}
local lots_taken = {}
-- (from the allowance's room, uncovered)
local function take(kind, amount, room)
  local from_allowance = math.min(amount, room)
  local rest = amount - from_allowance
  for _, lot in ipairs(active) do
    if rest <= 0 then break end
    if lot.kind == kind and lot.rem > 0 then
      local n = math.min(rest, lot.rem)
      lot.rem = lot.rem - n
      rest = rest - n
      changed[lot.id] = lot
      table.insert(lots_taken, lot.id); table.insert(lots_taken, kind); table.insert(lots_taken, n)
      if kind == 't' then paid[3] = paid[3] + n else paid[4] = paid[4] + n end
    end
  end
  return from_allowance, rest
end
local function correct(key, field, by)
  if by ~= 0 then
    local v = redis.call('HINCRBY', key, field, by)
    if v < 0 then redis.call('HSET', key, field, 0) end
  end
end

local used_t, used_r = tonumber(ARGV[16]), tonumber(ARGV[17])
local n_fixes, n_scopes = tonumber(ARGV[18]), tonumber(ARGV[19])
local room_r = BIG
if wr > 0 then room_r = math.max(0, wr - m.sr) end
local room_used_t, over_t = take('t', used_t, math.max(0, wt - m.sa))
local room_used_r, over_r = take('r', used_r, room_r)
paid[1] = room_used_t + over_t
paid[2] = room_used_r + over_r
local settled = {room_used_t, room_used_r, over_t, over_r}
for _, v in ipairs(lots_taken) do table.insert(settled, v) end
local a = 20
for i = 1, n_fixes do
  local widx = tonumber(ARGV[a])
  if redis.call('EXISTS', KEYS[W + widx]) == 1 then
    correct(KEYS[W + widx], 'i', tonumber(ARGV[a + 1]))
    correct(KEYS[W + widx], 'o', tonumber(ARGV[a + 2]))
  end
  a = a + 3
end
for id, lot in pairs(changed) do
  redis.call('HSET', KEYS[4], id, lot.kind .. ',' .. lot.rem .. ',' .. lot.exp .. ',' .. lot.tier)
end
local ttl = tonumber(ARGV[7])
if used_t + used_r > 0 then spend_add(m, KEYS[3], now, ttl, paid[1], paid[2], paid[3], paid[4]) end

local K = tonumber(ARGV[8])
local unlimited = ARGV[5] == '1'
local drained = (tonumber(redis.call('HGET', KEYS[1], 'dr') or '0') or 0) > now
local function drain()
  drained = true
  redis.call('HSET', KEYS[1], 'dr', now + DRAIN_MS)
end

-- Windows first: a window too full for a chunk drains the account as a spent balance does.
local fields, lease_fields = {'r', 'i', 'o'}, {'Lr', 'Li', 'Lo'}
local elapsed = now % 60000
local scopes = {}
for s = 1, n_scopes do
  local pkey, ckey = KEYS[W + tonumber(ARGV[a])], KEYS[W + tonumber(ARGV[a + 1])]
  local ridx = tonumber(ARGV[a + 5])
  if ridx > 0 and redis.call('EXISTS', KEYS[W + ridx]) == 1 then
    for d = 1, 3 do
      correct(KEYS[W + ridx], fields[d], -tonumber(ARGV[a + 5 + d]))
      correct(KEYS[W + ridx], lease_fields[d], -tonumber(ARGV[a + 8 + d]))
    end
  end
  local prev = redis.call('HMGET', pkey, 'r', 'i', 'o')
  local curr = redis.call('HMGET', ckey, 'r', 'i', 'o')
  local out = {0, 0, 0, 0, 0, 0}
  local fits = true
  for d = 1, 3 do
    local p = tonumber(prev[d] or '0') or 0
    local c = tonumber(curr[d] or '0') or 0
    out[3 + d] = math.floor(p * (60000 - elapsed) / 60000) + c
    local cap, ask = tonumber(ARGV[a + 1 + d]), tonumber(ARGV[a + 11 + d])
    if cap > 0 and ask > 0 and cap - out[3 + d] < K * ask then fits = false end
  end
  if not fits then drain() end
  scopes[s] = {out = out, key = ckey, a = a, fits = fits}
  a = a + 15
end

local grant_t, grant_r = 0, 0
local inflight_t, inflight_r = tonumber(ARGV[9]), tonumber(ARGV[10])
local free_t, free_r = tonumber(ARGV[11]), tonumber(ARGV[12])
local ask_t, ask_r = tonumber(ARGV[13]), tonumber(ARGV[14])
local lot_t, lot_r, max_tier = 0, 0, -1
for _, lot in ipairs(active) do
  if lot.rem > 0 then
    if lot.kind == 't' then lot_t = lot_t + lot.rem else lot_r = lot_r + lot.rem end
    if tonumber(lot.tier) > max_tier then max_tier = tonumber(lot.tier) end
  end
end
if unlimited and not drained then
  grant_t, grant_r = ask_t, ask_r
elseif not drained then
  local left_t = math.max(0, wt - m.sa) + lot_t - m.rt - inflight_t - free_t
  local left_r = BIG
  if wr > 0 then left_r = math.max(0, wr - m.sr) + lot_r - m.rr - inflight_r - free_r end
  grant_t = math.min(ask_t, math.floor(math.max(0, left_t) / K))
  grant_r = math.min(ask_r, math.floor(math.max(0, left_r) / K))
  if (ask_t > 0 and free_t + grant_t < tonumber(ARGV[15])) or (ask_r > 0 and free_r + grant_r < 1) then
    drain()
  end
end
local mode = 'lease'
if drained then
  mode = 'exact'
  free_t, free_r, grant_t, grant_r = 0, 0, 0, 0
end

local scope_out = {}
for s = 1, n_scopes do
  local sc = scopes[s]
  local out = sc.out
  if mode == 'lease' then
    for d = 1, 3 do
      local cap, ask = tonumber(ARGV[sc.a + 1 + d]), tonumber(ARGV[sc.a + 11 + d])
      if cap > 0 and ask > 0 then
        out[d] = ask
        redis.call('HINCRBY', sc.key, fields[d], ask)
        redis.call('HINCRBY', sc.key, lease_fields[d], ask)
      end
    end
    if out[1] + out[2] + out[3] > 0 then redis.call('EXPIRE', sc.key, 150) end
  end
  scope_out[s] = out
end

local keep_t = inflight_t + free_t + grant_t
local keep_r = inflight_r + free_r + grant_r
local first = 0
if keep_t > 0 or keep_r > 0 then
  redis.call('HSET', KEYS[2], lease_id, keep_t .. ',' .. keep_r .. ',' .. now .. ',' ..
    (free_t + grant_t) .. ',' .. (free_r + grant_r))
  redis.call('ZADD', KEYS[5], now, lease_id)
  if held_nothing then first = 1 end
  if now - m.x >= HOUR_MS then
    m.x = now
    for k = 1, 5 do redis.call('EXPIRE', KEYS[k], ttl) end
  elseif held_nothing then
    redis.call('EXPIRE', KEYS[2], ttl)
    redis.call('EXPIRE', KEYS[5], ttl)
  end
  m.rt = m.rt + keep_t
  m.rr = m.rr + keep_r
  m.ft = m.ft + free_t + grant_t
  m.fr = m.fr + free_r + grant_r
end
write_account(KEYS[1], m)
return {mode, grant_t, grant_r, m.sa + m.sl, max_tier, first, settled, scope_out}
