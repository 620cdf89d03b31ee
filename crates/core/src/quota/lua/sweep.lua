-- Release one account's reservations whose requests never settled (their instance died), and
-- keep the account's place in the sweep's set. account.lua is prepended.
-- KEYS: 1 meta, 2 reservations, 3 reservation start times, 4 (optional) the sweep's set
-- ARGV: 1 now_ms, 2 reservation timeout ms, 3 account id
-- Returns {released, oldest}: how many reservations were released, and the start time of the
-- oldest one still held (-1: none). Without KEYS[4] (a Redis Cluster keeps the set in another
-- slot) the caller moves the account in the set; an account that gets a reservation between
-- the two calls may leave the set, and its stale reservations are then released by its next
-- reservation instead.
local now = tonumber(ARGV[1])
local m = read_account(KEYS[1])
local released, oldest = 0, -1
if m then
  local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - tonumber(ARGV[2])))
  for _, id in ipairs(stale) do release(m, KEYS[2], KEYS[3], id) end
  -- Only the held sums: the week's sums may not be built yet (write_account would mark them).
  if #stale > 0 then
    redis.call('HSET', KEYS[1], 'rt', m.rt, 'rr', m.rr, 'ft', m.ft, 'fr', m.fr, 'xa', m.xa,
      'xr', m.xr)
  end
  released = #stale
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if first[2] then oldest = tonumber(first[2]) end
end
if KEYS[4] then
  if oldest >= 0 then
    redis.call('ZADD', KEYS[4], 'XX', oldest, ARGV[3])
  else
    redis.call('ZREM', KEYS[4], ARGV[3])
  end
end
return {released, oldest}
