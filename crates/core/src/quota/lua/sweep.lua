-- Release the reservations whose requests never settled (their instance died) of one or more
-- accounts, and keep each account's place in the sweep's set. account.lua is prepended.
-- KEYS: for each account: meta, reservations, reservation start times; then, optionally, the
--       sweep's set (a Redis Cluster keeps it in another slot, and sweeps one account a call)
-- ARGV: 1 now_ms, 2 reservation timeout ms, then each account's id, in the order of KEYS
-- Returns {released, oldest, released, oldest, ...}, per account: how many reservations were
-- released, and the start time of the oldest one still held (-1: none). Without the set the
-- caller moves the account in the set; an account that gets a reservation between the two calls
-- may leave the set, and its stale reservations are then released by its next reservation
-- instead.
-- Cost: a lease whose start time its instance keeps pushing back has nothing stale, and most
-- visits find nothing: the account's hash is read only when something is to be released.
local now = tonumber(ARGV[1])
local before = '(' .. (now - tonumber(ARGV[2]))
local n = #ARGV - 2
local set = KEYS[3 * n + 1]
local out = {}
for j = 0, n - 1 do
  local meta, held, held_at = KEYS[3 * j + 1], KEYS[3 * j + 2], KEYS[3 * j + 3]
  local released, oldest = 0, -1
  local stale = redis.call('ZRANGEBYSCORE', held_at, '-inf', before)
  -- An account no longer in Redis (expired) holds nothing: it leaves the set.
  local gone = false
  if #stale > 0 then
    local m = read_account(meta)
    if m then
      for _, id in ipairs(stale) do release(m, held, held_at, id) end
      -- Only the held sums: the week's sums may not be built yet (write_account would mark
      -- them).
      redis.call('HSET', meta, 'rt', m.rt, 'rr', m.rr, 'ft', m.ft, 'fr', m.fr, 'xa', m.xa,
        'xr', m.xr)
      released = #stale
    else
      gone = true
    end
  end
  if not gone then
    local first = redis.call('ZRANGE', held_at, 0, 0, 'WITHSCORES')
    if first[2] then oldest = tonumber(first[2]) end
  end
  if set then
    if oldest >= 0 then
      redis.call('ZADD', set, 'XX', oldest, ARGV[3 + j])
    else
      redis.call('ZREM', set, ARGV[3 + j])
    end
  end
  out[2 * j + 1] = released
  out[2 * j + 2] = oldest
end
return out
