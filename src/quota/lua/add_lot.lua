-- Add a lot granted elsewhere to an account already in Redis (idempotent).
-- KEYS: 1 meta, 2 lots.  ARGV: 1 lot id, 2 "kind,remaining,expires_ms,tier"
if redis.call('HEXISTS', KEYS[1], 'loaded') == 0 then return 0 end
return redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
