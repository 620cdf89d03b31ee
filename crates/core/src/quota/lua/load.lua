-- Load one account's balance from the database snapshot the caller read, unless another
-- instance loaded it first.
-- KEYS: 1 meta, 2 reservations, 3 spend buckets, 4 lots, 5 reservation start times
-- ARGV: 1 ttl seconds, 2 number of spend buckets n, then n pairs (hour, "at,ar,lt,lr"),
--       then pairs (lot id, "kind,remaining,expires_ms,tier")
if redis.call('HSETNX', KEYS[1], 'loaded', 1) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'rt', 0, 'rr', 0, 'ft', 0, 'fr', 0, 'xa', 0, 'xr', 0)
-- The week's sums (account.lua) are built by the first reserve or settle after this.
redis.call('HDEL', KEYS[1], 'v', 'sa', 'sr', 'sl', 'so', 'x', 'dr', 'bh', 'bv')
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
local n = tonumber(ARGV[2])
local i = 3
for _ = 1, n do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i < #ARGV do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  i = i + 2
end
for k = 1, 5 do redis.call('EXPIRE', KEYS[k], tonumber(ARGV[1])) end
return 1
