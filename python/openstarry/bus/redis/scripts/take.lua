-- Take a free lease for a new epoch: "consumer|epoch". The epoch counter only grows, so
-- whatever an earlier owner of the partition still holds (a process frozen past its lease,
-- then thawed) names an epoch that is not the lease's any more, and its commits and
-- journal writes are refused (flush.lua, journal.lua).
-- KEYS[1]: the lease; KEYS[2]: the partition's epoch counter (one hash tag).
-- ARGV[1]: the consumer; ARGV[2]: the lease's time to live, in ms.
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local value = ARGV[1] .. '|' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return value
