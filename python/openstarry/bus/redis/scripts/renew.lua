-- Renew a lease; one that lapsed while no other consumer took it is taken back
-- (this consumer was only slow: what it holds is still its own).
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not owner then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
