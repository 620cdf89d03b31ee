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
-- When the weekly allowance alone covers everything the lease keeps, beyond every other
-- reservation and lease, the lease is set aside from the allowance instead (xa, xr rather than
-- rt, rr; see account.lua): nothing else can pay from that part of the allowance, so the
-- instance knows at settlement that a request within it is paid by the allowance, records it at
-- once and reports the sum at its next renewal (ARGV 21, 22) rather than on a clock.
-- Per-minute windows: a lease's chunk is charged to its minute's window up front and its unused
-- part given back later, so a window counts at least what was admitted in it. A minute's count
-- adds the next minute's window (see the windows below).
--
-- KEYS: 1 meta, 2 reservations, 3 spend buckets, 4 lots, 5 reservation start times,
--       then the per-minute window keys the arguments name by index (1 = KEYS[6])
-- ARGV: 1 now_ms, 2 lease id, 3 weekly_tokens, 4 weekly_requests, 5 unlimited (0/1),
--       6 reservation timeout ms, 7 account ttl seconds, 8 K,
--       9, 10 tokens and requests held by admitted requests, 11, 12 unused tokens and requests,
--       13, 14 tokens and requests asked for on top, 15 the least useful share of tokens,
--       16, 17 tokens and requests settled in all, 18 number of window corrections n,
--       19 number of scopes s, 20 flags: 1 = push the lease's start time back (the sweep
--       releases a lease whose start is older than the reservation timeout), 2 = read the lots
--       even if the allowance covers everything (for the highest lot tier),
--       21, 22 tokens and requests settled out of the lease's set-aside share (each already
--       recorded as paid by the allowance: they are booked, never split),
--       then n corrections: window index, input correction, output correction (actual - charged),
--       then s scopes: previous-minute window index, current-minute window index, caps (r, i, o),
--         index of the window a chunk is given back to (0: none), its unused part (r, i, o), the
--         whole chunk (r, i, o), the chunk asked for (r, i, o), the least chunk worth taking
--         (r, i, o): less than that drains the account, the next minute's window index (0:
--         none; given whenever a chunk is asked for, as its count is part of this minute's),
--         the next minute's chunk given back (r, i, o), the next minute's chunk asked for
--         (r, i, o), the window index of the scope's standing grants (each minute's count adds
--         them, see account.lua's grant_counts), 1 to end this instance's grant (else 0), the
--         grant's field as it is to stay: the minutes up to this one ('' to delete it)
--
-- Cost: the work is what changed. Stale reservations are left to reserve.lua and the sweep;
-- the lots are read only when the allowance alone cannot pay or grant (or flag 2); a scope's
-- windows are touched only when its chunk is given back or granted; the lease's start time
-- only when flag 1 asks.
-- Returns {'load'} when the account is not in Redis; otherwise
-- {mode, tokens granted, requests granted, weekly_total_tokens, max_lot_tier, first,
--  settlements, scopes, aside}: mode 'lease', or 'exact' (drained: the lease now holds only what
-- admitted requests hold); first = 1 when the account held nothing before; settled =
-- {allowance tokens, allowance requests, uncovered tokens, uncovered requests (booked on the
-- allowance too), lot_id, kind, amount, ...}; scopes = for each,
-- {chunk r, i, o, sliding count r, i, o before the chunks (the next minute's window included),
-- next minute's chunk r, i, o, the next minute's window count r, i, o before it}. max_lot_tier
-- is -2 when the lots were not read (the caller keeps what it knew). aside = 1 when the lease
-- is now set aside.
-- A window's field L counts the chunks leases hold in it (all three dimensions together), so
-- reserve.lua knows whether waiting for the leases can help.
local now = tonumber(ARGV[1])
local m = read_account(KEYS[1])
if not m then return {'load'} end
local DRAIN_MS = 2000
local BIG = 9007199254740991
local W = 5

spend_window(m, KEYS[3], KEYS[2], KEYS[5], now)
local lease_id = ARGV[2]
local old = redis.call('HGET', KEYS[2], lease_id)
local had_lease = old ~= false and old ~= nil
if had_lease then unhold(m, old) end
local held_nothing = not had_lease and m.rt == 0 and m.rr == 0 and m.xa == 0 and m.xr == 0
local flags = tonumber(ARGV[20])

-- The lots, read once and only when needed.
local active = nil
local max_tier = -2
local function lots()
  if not active then active = active_lots(KEYS[4], now) end
  return active
end
if flags >= 2 then lots() end

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
  if rest <= 0 then return from_allowance, 0 end
  for _, lot in ipairs(lots()) do
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
-- A window key a correction creates gets the windows' expiry.
local function correct(key, field, by)
  if by ~= 0 then
    local v = redis.call('HINCRBY', key, field, by)
    if v == by then redis.call('EXPIRE', key, 150) end
    if v < 0 then redis.call('HSET', key, field, 0) end
  end
end

local used_t, used_r = tonumber(ARGV[16]), tonumber(ARGV[17])
local aside_t, aside_r = tonumber(ARGV[21]), tonumber(ARGV[22])
local n_fixes, n_scopes = tonumber(ARGV[18]), tonumber(ARGV[19])
-- The set-aside share paid its settlements already (the lease's entry no longer counts in xa,
-- xr: unhold above); the others pay from what is left beyond every set-aside share.
local room_r = BIG
if wr > 0 then room_r = math.max(0, wr - m.sr - m.xr - aside_r) end
local room_used_t, over_t = take('t', used_t, math.max(0, wt - m.sa - m.xa - aside_t))
local room_used_r, over_r = take('r', used_r, room_r)
paid[1] = room_used_t + over_t + aside_t
paid[2] = room_used_r + over_r + aside_r
local settled = {room_used_t, room_used_r, over_t, over_r}
for _, v in ipairs(lots_taken) do table.insert(settled, v) end
local a = 23
for i = 1, n_fixes do
  local key = KEYS[W + tonumber(ARGV[a])]
  correct(key, 'i', tonumber(ARGV[a + 1]))
  correct(key, 'o', tonumber(ARGV[a + 2]))
  a = a + 3
end
for id, lot in pairs(changed) do
  redis.call('HSET', KEYS[4], id, lot.kind .. ',' .. lot.rem .. ',' .. lot.exp .. ',' .. lot.tier)
end
local ttl = tonumber(ARGV[7])
if used_t + used_r + aside_t + aside_r > 0 then spend_add(m, KEYS[3], now, ttl, paid[1], paid[2], paid[3], paid[4]) end

local K = tonumber(ARGV[8])
local unlimited = ARGV[5] == '1'
local drained = m.dr > now
local function drain()
  drained = true
  redis.call('HSET', KEYS[1], 'dr', now + DRAIN_MS)
end

-- Windows first: a window too full for the least useful chunk drains the account as a spent
-- balance does; otherwise a chunk takes at most 1/K of what the window has left.
-- A chunk asked for the next minute, ahead of it, is counted in that minute's window only, and
-- every count taken this minute (here and in reserve.lua) adds the next minute's window to the
-- sliding one: whatever this minute admits besides, this minute's count and the next one's
-- together stay within the cap, which is what the sliding window holds as the next minute
-- begins (when the chunk's requests may all come at once). It is granted whole and only while
-- the count stays within half the cap (a busy window asks for chunks in its own minute).
local fields = {'r', 'i', 'o'}
local elapsed = now % 60000
-- Gives a chunk back to the window `key`: its unused part (r, i, o) from ARGV[unused_at + 1..3]
-- off the counts, the whole chunk (ARGV[whole_at + 1..3]) off the leases' count L.
local function give_back(key, unused_at, whole_at)
  local whole = 0
  for d = 1, 3 do
    correct(key, fields[d], -tonumber(ARGV[unused_at + d]))
    whole = whole + tonumber(ARGV[whole_at + d])
  end
  correct(key, 'L', -whole)
end
local scopes = {}
for s = 1, n_scopes do
  local ckey = KEYS[W + tonumber(ARGV[a + 1])]
  local ridx = tonumber(ARGV[a + 5])
  if ridx > 0 then give_back(KEYS[W + ridx], a + 5, a + 8) end
  local nidx = tonumber(ARGV[a + 18])
  local nkey = nil
  if nidx > 0 then
    nkey = KEYS[W + nidx]
    -- The next minute's chunk: nothing of it used yet, so all of it comes back.
    give_back(nkey, a + 18, a + 18)
  end
  local gkey = KEYS[W + tonumber(ARGV[a + 25])]
  if ARGV[a + 26] == '1' then
    if ARGV[a + 27] == '' then
      redis.call('HDEL', gkey, lease_id)
    else
      redis.call('HSET', gkey, lease_id, ARGV[a + 27])
      -- As the grants' writer gives it (ahead.rs): a hash Redis lost comes back expiring.
      redis.call('EXPIRE', gkey, 780)
    end
  end
  local out = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  local asked, ahead_asked = false, false
  for d = 1, 3 do
    if tonumber(ARGV[a + 1 + d]) > 0 then
      if tonumber(ARGV[a + 11 + d]) > 0 then asked = true end
      if tonumber(ARGV[a + 21 + d]) > 0 then ahead_asked = true end
    end
  end
  local fits = true
  local new_key = false
  local nxt = {}
  local granted = nil
  if asked or ahead_asked then
    local prev = redis.call('HMGET', KEYS[W + tonumber(ARGV[a])], 'r', 'i', 'o')
    local curr = redis.call('HMGET', ckey, 'r', 'i', 'o')
    if nkey then nxt = redis.call('HMGET', nkey, 'r', 'i', 'o') end
    new_key = not curr[1] and not curr[2] and not curr[3]
    granted = grant_counts(gkey, math.floor(now / 60000))
    for d = 1, 3 do
      local p = (tonumber(prev[d] or '0') or 0) + granted[1][d]
      local c = (tonumber(curr[d] or '0') or 0) + granted[2][d]
      local n = (tonumber(nxt[d] or '0') or 0) + granted[3][d]
      out[3 + d] = math.floor(p * (60000 - elapsed) / 60000) + c + n
      local cap, ask = tonumber(ARGV[a + 1 + d]), tonumber(ARGV[a + 11 + d])
      if cap > 0 and ask > 0 then
        local g = math.min(ask, math.floor(math.max(0, cap - out[3 + d]) / K))
        if g < tonumber(ARGV[a + 14 + d]) then fits = false end
        out[d] = g
      end
    end
  end
  local new_next = false
  if ahead_asked and fits and not drained then
    new_next = not nxt[1] and not nxt[2] and not nxt[3]
    local roomy = true
    for d = 1, 3 do
      local n = (tonumber(nxt[d] or '0') or 0) + granted[3][d]
      out[9 + d] = n
      local cap, ask = tonumber(ARGV[a + 1 + d]), tonumber(ARGV[a + 21 + d])
      if cap > 0 and ask > 0 then
        -- The count includes the next window's (n): this bounds that window too.
        if 2 * (out[3 + d] + out[d] + ask) > cap then roomy = false end
        out[6 + d] = ask
      end
    end
    if not roomy then out[7], out[8], out[9] = 0, 0, 0 end
  end
  if not fits then drain() end
  scopes[s] = {out = out, key = ckey, new_key = new_key, nkey = nkey, new_next = new_next}
  a = a + 28
end

local grant_t, grant_r = 0, 0
local inflight_t, inflight_r = tonumber(ARGV[9]), tonumber(ARGV[10])
local free_t, free_r = tonumber(ARGV[11]), tonumber(ARGV[12])
local ask_t, ask_r = tonumber(ARGV[13]), tonumber(ARGV[14])
if unlimited and not drained then
  grant_t, grant_r = ask_t, ask_r
elseif not drained and (ask_t > 0 or ask_r > 0) then
  local left_t = math.max(0, wt - m.sa - m.xa) - m.rt - inflight_t - free_t
  local left_r = BIG
  if wr > 0 then left_r = math.max(0, wr - m.sr - m.xr) - m.rr - inflight_r - free_r end
  if left_t < K * ask_t or (wr > 0 and left_r < K * ask_r) then
    -- The allowance alone does not cover the share: count the lots too.
    local lot_t, lot_r = 0, 0
    for _, lot in ipairs(lots()) do
      if lot.kind == 't' then lot_t = lot_t + lot.rem else lot_r = lot_r + lot.rem end
    end
    left_t = left_t + lot_t
    if wr > 0 then left_r = left_r + lot_r end
  end
  grant_t = math.min(ask_t, math.floor(math.max(0, left_t) / K))
  grant_r = math.min(ask_r, math.floor(math.max(0, left_r) / K))
  if (ask_t > 0 and free_t + grant_t < tonumber(ARGV[15])) or (ask_r > 0 and free_r + grant_r < 1) then
    drain()
  end
end
if active then max_tier = top_tier(active) end
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
    local whole, wrote = 0, false
    for d = 1, 3 do
      if out[d] > 0 then
        redis.call('HINCRBY', sc.key, fields[d], out[d])
        wrote = true
      end
      whole = whole + out[d]
    end
    if whole > 0 then redis.call('HINCRBY', sc.key, 'L', whole) end
    if wrote and sc.new_key then redis.call('EXPIRE', sc.key, 150) end
    local ahead = 0
    for d = 1, 3 do
      if out[6 + d] > 0 then
        redis.call('HINCRBY', sc.nkey, fields[d], out[6 + d])
        ahead = ahead + out[6 + d]
      end
    end
    if ahead > 0 then
      redis.call('HINCRBY', sc.nkey, 'L', ahead)
      if sc.new_next then redis.call('EXPIRE', sc.nkey, 150) end
    end
  else
    for d = 1, 3 do
      out[d], out[6 + d] = 0, 0
    end
  end
  scope_out[s] = out
end

local keep_t = inflight_t + free_t + grant_t
local keep_r = inflight_r + free_r + grant_r
-- Set aside when the allowance alone covers what the lease keeps, beyond everything else held:
-- no reservation already admitted can then find its allowance gone.
local aside = math.max(0, wt - m.sa - m.xa) - m.rt >= keep_t
  and (wr <= 0 or math.max(0, wr - m.sr - m.xr) - m.rr >= keep_r)
local first = 0
if keep_t > 0 or keep_r > 0 then
  redis.call('HSET', KEYS[2], lease_id, keep_t .. ',' .. keep_r .. ',' .. now .. ',' ..
    (free_t + grant_t) .. ',' .. (free_r + grant_r) .. (aside and ',1' or ''))
  if not had_lease or flags % 2 == 1 then redis.call('ZADD', KEYS[5], now, lease_id) end
  if held_nothing then first = 1 end
  if now - m.x >= HOUR_MS then
    m.x = now
    for k = 1, 5 do redis.call('EXPIRE', KEYS[k], ttl) end
  elseif held_nothing then
    redis.call('EXPIRE', KEYS[2], ttl)
    redis.call('EXPIRE', KEYS[5], ttl)
  end
  if aside then
    m.xa = m.xa + keep_t
    m.xr = m.xr + keep_r
  else
    m.rt = m.rt + keep_t
    m.rr = m.rr + keep_r
  end
  m.ft = m.ft + free_t + grant_t
  m.fr = m.fr + free_r + grant_r
elseif had_lease then
  redis.call('HDEL', KEYS[2], lease_id)
  redis.call('ZREM', KEYS[5], lease_id)
end
write_account(KEYS[1], m)
return {mode, grant_t, grant_r, m.sa + m.sl, max_tier, first, settled, scope_out,
  aside and 1 or 0}
