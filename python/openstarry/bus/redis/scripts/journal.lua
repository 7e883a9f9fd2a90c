-- Record one completed step of a run (a model response, a tool's outcome) in its
-- journal, if the partition's lease is still the one the run was started under: a
-- worker frozen past its lease and thawed records nothing (and stops the run).
-- The commit that acknowledges the run's input deletes the journal (flush.lua).
-- KEYS[1]: the journal (a list); KEYS[2]: the partition's lease; KEYS[3]: its epoch
-- counter (one hash tag).
-- ARGV[1]: the lease's value the run holds; ARGV[2]: the step;
-- ARGV[3]: steps a journal holds at most; ARGV[4]: its time to live, in ms.
-- Returns the steps recorded, -1 when the lease moved on, -2 when the journal is full.
local owner = redis.call('GET', KEYS[2])
if owner ~= ARGV[1] and not (
  -- lapsed, and nobody took it since (a take makes a new epoch): still the run's
  not owner and redis.call('GET', KEYS[3]) == string.match(ARGV[1], '|(%d+)$')
) then
  return -1
end
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[3]) then return -2 end
local n = redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return n
