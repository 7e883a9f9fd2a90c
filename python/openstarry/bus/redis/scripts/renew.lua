-- Renew a lease. One that lapsed while no other consumer took it is taken back (this
-- consumer was only slow: what it holds is still its own); one that another consumer
-- took since, even if that one freed it again, is lost (its epoch moved on).
-- KEYS[1]: the lease; KEYS[2]: the partition's epoch counter.
-- ARGV[1]: the lease's value ("consumer|epoch"); ARGV[2]: time to live, in ms;
-- ARGV[3]: the epoch.
local owner = redis.call('GET', KEYS[1])
if owner == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not owner and redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
