-- Prepended to lease.lua (after account.lua): the light path of a renewal whose only work is
-- paying what was settled out of the lease and topping up its share from the weekly allowance
-- (no window touched), the common case of an account sending a request every few seconds,
-- and of the periodic renewal that pushes the lease's start time back (flag 1) and reads the
-- lots for the tier hint (flag 2). It reads and writes only the meta fields and the lease entry
-- that this changes, without copying the call's keys and arguments, and gives the same answer
-- and the same state as lease.lua would. It also does the hourly chores such a renewal meets
-- (a payment in a new hour moves the last hour's spend bucket into the buckets hash; the keys'
-- expiry is pushed back once an hour), each a few commands, where lease.lua's whole body would
-- cost the call about twice its time: an account renewed every few minutes meets one of them
-- at every hour. Anything else lease.lua does beyond that (the settlement or the share not
-- covered by the allowance alone, so the lots count; a share that would drain the account; the
-- first spend bucket; the week's sums to rebuild; a drained account; no lease held) returns nil
-- before anything is written: lease.lua then runs.
-- keys, ki: the call's KEYS and the index before this account's (meta is keys[ki + 1]);
-- args, ai: likewise for lease.lua's arguments.
local function pay_only(keys, ki, args, ai)
  if args[ai + 18] ~= '0' or args[ai + 19] ~= '0' then
    return nil
  end
  local flags = tonumber(args[ai + 20])
  local now = tonumber(args[ai + 1])
  local meta = keys[ki + 1]
  local f = redis.call('HMGET', meta, 'v', 'so', 'sa', 'sr', 'sl', 'rt', 'rr', 'x', 'ft', 'fr',
    'dr', 'bh', 'bv', 'xa', 'xr')
  local hour = math.floor(now / HOUR_MS)
  if f[1] ~= '2' or not f[2] or tonumber(f[2]) < hour - 167 or not f[12] or not f[13]
    or tonumber(f[11] or '0') > now then
    return nil
  end
  local lease_id = args[ai + 2]
  local old = redis.call('HGET', keys[ki + 2], lease_id)
  if not old then return nil end
  local t, r, _, ft, fr, was_aside = string.match(old, '(%d+),(%d+),(%d+),?(%d*),?(%d*),?(%d*)')
  -- What every other reservation holds and every other lease sets aside.
  local others_t, others_r = tonumber(f[6] or '0'), tonumber(f[7] or '0')
  local xo_t, xo_r = tonumber(f[14] or '0'), tonumber(f[15] or '0')
  if was_aside == '1' then
    xo_t, xo_r = math.max(0, xo_t - tonumber(t)), math.max(0, xo_r - tonumber(r))
  else
    others_t, others_r = math.max(0, others_t - tonumber(t)), math.max(0, others_r - tonumber(r))
  end
  local used_t, used_r = tonumber(args[ai + 16]), tonumber(args[ai + 17])
  local aside_t, aside_r = tonumber(args[ai + 21]), tonumber(args[ai + 22])
  local sa, sr = tonumber(f[3] or '0') + aside_t, tonumber(f[4] or '0') + aside_r
  local wt, wr = tonumber(args[ai + 3]), tonumber(args[ai + 4])
  if wt - sa - xo_t < used_t or (wr > 0 and wr - sr - xo_r < used_r) then return nil end
  sa, sr = sa + used_t, sr + used_r
  local room_t = math.max(0, wt - sa - xo_t) - others_t
  local room_r = math.max(0, wr - sr - xo_r) - others_r
  local inflight_t, inflight_r = tonumber(args[ai + 9]), tonumber(args[ai + 10])
  local free_t, free_r = tonumber(args[ai + 11]), tonumber(args[ai + 12])
  local grant_t, grant_r = tonumber(args[ai + 13]), tonumber(args[ai + 14])
  if (grant_t > 0 or grant_r > 0) and args[ai + 5] ~= '1' then
    -- The whole share asked for, when the allowance alone leaves K times it beyond every
    -- reservation and lease (lease.lua would grant exactly that, without reading the lots).
    local k = tonumber(args[ai + 8])
    if room_t - inflight_t - free_t < k * grant_t then return nil end
    if wr > 0 and room_r - inflight_r - free_r < k * grant_r then return nil end
    if (grant_t > 0 and free_t + grant_t < tonumber(args[ai + 15]))
      or (grant_r > 0 and free_r + grant_r < 1) then
      return nil
    end
  end
  free_t, free_r = free_t + grant_t, free_r + grant_r
  local keep_t, keep_r = inflight_t + free_t, inflight_r + free_r
  if keep_t == 0 and keep_r == 0 then return nil end
  local aside = room_t >= keep_t and (wr <= 0 or room_r >= keep_r)
  local rt, rr, xa, xr = others_t, others_r, xo_t, xo_r
  if aside then
    xa, xr = xa + keep_t, xr + keep_r
  else
    rt, rr = rt + keep_t, rr + keep_r
  end
  local mft, mfr = tonumber(f[9] or '0'), tonumber(f[10] or '0')
  if ft ~= '' then
    mft = math.max(0, mft - tonumber(ft))
    mfr = math.max(0, mfr - tonumber(fr))
  end
  -- The lots only for the tier hint (the allowance pays everything here): expired ones are
  -- dropped, as lease.lua's read does.
  local max_tier = -2
  if flags >= 2 then max_tier = top_tier(active_lots(keys[ki + 4], now)) end
  if flags % 2 == 1 then redis.call('ZADD', keys[ki + 5], now, lease_id) end
  local paid_t, paid_r = used_t + aside_t, used_r + aside_r
  local ttl = tonumber(args[ai + 7])
  local written = {'sa', sa, 'sr', sr, 'rt', rt, 'rr', rr, 'xa', xa, 'xr', xr,
    'ft', mft + free_t, 'fr', mfr + free_r}
  -- The hour's bucket, as spend_add keeps it: only a payment touches it, and a payment in
  -- another hour first adds the bucket to the buckets hash (flush_bucket).
  if paid_t + paid_r > 0 then
    local bh = tonumber(f[12])
    local b1, b2, b3, b4 = string.match(f[13], '(%d+),(%d+),(%d+),(%d+)')
    if bh ~= hour then
      flush_bucket({bh = bh, bv = {tonumber(b1), tonumber(b2), tonumber(b3), tonumber(b4)}},
        keys[ki + 3], ttl)
      b1, b2, b3, b4 = 0, 0, 0, 0
      table.insert(written, 'bh'); table.insert(written, hour)
    end
    table.insert(written, 'bv')
    table.insert(written, (b1 + paid_t) .. ',' .. (b2 + paid_r) .. ',' .. b3 .. ',' .. b4)
  end
  -- The keys' expiry, pushed back once an hour as lease.lua does for a lease it keeps.
  if now - tonumber(f[8] or '0') >= HOUR_MS then
    for k = 1, 5 do redis.call('EXPIRE', keys[ki + k], ttl) end
    table.insert(written, 'x'); table.insert(written, now)
  end
  redis.call('HSET', meta, unpack(written))
  redis.call('HSET', keys[ki + 2], lease_id, keep_t .. ',' .. keep_r .. ',' .. now .. ',' ..
    free_t .. ',' .. free_r .. (aside and ',1' or ''))
  return {'lease', grant_t, grant_r, sa + tonumber(f[5] or '0'), max_tier, 0,
    {used_t, used_r, 0, 0}, {}, aside and 1 or 0}
end
