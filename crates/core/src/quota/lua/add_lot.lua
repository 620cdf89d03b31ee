-- Add a lot granted elsewhere to an account already in Redis (idempotent).
-- KEYS: 1 meta, 2 lots.  ARGV: 1 lot id, 2 "kind,remaining,expires_ms,tier", 3 ttl seconds
if redis.call('HEXISTS', KEYS[1], 'loaded') == 0 then return 0 end
local added = redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return added
