-- Replace one account's balance with the database's after a Redis outage, during which this
-- instance served it from its in-process engine. Unlike load.lua it always writes, and it keeps
-- the reservations other instances hold, less the listed ones (settled during the outage).
-- KEYS: 1 meta, 2 reservations, 3 spend buckets, 4 lots, 5 reservation start times
-- ARGV: 1 ttl seconds, 2 number of spend buckets n, 3 number of released reservations d,
--       then d reservation ids, then n pairs (hour, "at,ar,lt,lr"),
--       then pairs (lot id, "kind,remaining,expires_ms,tier")
local n = tonumber(ARGV[2])
local d = tonumber(ARGV[3])
local i = 4
for _ = 1, d do
  redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('ZREM', KEYS[5], ARGV[i])
  i = i + 1
end
local rt, rr, ft, fr, xa, xr = 0, 0, 0, 0, 0, 0
for _, h in ipairs(redis.call('HVALS', KEYS[2])) do
  local t, r, _, lt, lr, aside = string.match(h, '(%d+),(%d+),(%d+),?(%d*),?(%d*),?(%d*)')
  if t and aside == '1' then
    xa = xa + tonumber(t); xr = xr + tonumber(r)
  elseif t then
    rt = rt + tonumber(t); rr = rr + tonumber(r)
  end
  if lt and lt ~= '' then ft = ft + tonumber(lt); fr = fr + tonumber(lr) end
end
redis.call('HSET', KEYS[1], 'loaded', 1, 'rt', rt, 'rr', rr, 'ft', ft, 'fr', fr, 'xa', xa, 'xr', xr)
-- The week's sums (account.lua) are rebuilt by the next reserve or settle.
redis.call('HDEL', KEYS[1], 'v', 'sa', 'sr', 'sl', 'so', 'x', 'bh', 'bv')
redis.call('DEL', KEYS[3], KEYS[4])
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
