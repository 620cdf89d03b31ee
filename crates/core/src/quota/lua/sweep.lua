-- Release one account's reservations whose requests never settled (their instance died), and
-- keep the account's place in the sweep's set. account.lua is prepended.
-- KEYS: 1 meta, 2 reservations, 3 reservation start times, 4 the sweep's set of accounts
-- ARGV: 1 now_ms, 2 reservation timeout ms, 3 account id
-- Returns how many reservations were released.
local m = read_account(KEYS[1])
if not m then
  redis.call('ZREM', KEYS[4], ARGV[3])
  return 0
end
local now = tonumber(ARGV[1])
local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - tonumber(ARGV[2])))
for _, id in ipairs(stale) do release(m, KEYS[2], KEYS[3], id) end
-- Only the held sums: the week's sums may not be built yet (write_account would mark them so).
if #stale > 0 then redis.call('HSET', KEYS[1], 'rt', m.rt, 'rr', m.rr) end
local oldest = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
if oldest[2] then
  redis.call('ZADD', KEYS[4], 'XX', oldest[2], ARGV[3])
else
  redis.call('ZREM', KEYS[4], ARGV[3])
end
return #stale
