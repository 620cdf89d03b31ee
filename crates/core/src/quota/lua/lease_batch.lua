-- Many accounts' lease calls in one script call (one Redis, where keys of different accounts may
-- meet in one script): lease.lua's body runs once per account, as the function renew_one that
-- scripts.rs wraps around it, on that account's slice of KEYS and ARGV, unless pay.lua's light
-- path (reading that slice in place) did the account's work.
-- ARGV: 1 number of accounts n, then for each: its number of keys, its number of arguments,
--       its arguments (lease.lua's); KEYS: each account's keys (lease.lua's), in order.
-- Returns one lease.lua reply per account, in order.
local replies = {}
local ki, ai = 1, 2
local n = tonumber(ARGV[1])
for j = 1, n do
  local nk, na = tonumber(ARGV[ai]), tonumber(ARGV[ai + 1])
  ai = ai + 2
  local reply = pay_only(KEYS, ki - 1, ARGV, ai - 1)
  if not reply then
    local k, a = {}, {}
    for x = 1, nk do k[x] = KEYS[ki + x - 1] end
    for x = 1, na do a[x] = ARGV[ai + x - 1] end
    reply = renew_one(k, a)
  end
  ki = ki + nk
  ai = ai + na
  replies[j] = reply
end
return replies
