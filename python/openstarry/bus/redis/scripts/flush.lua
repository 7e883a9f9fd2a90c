-- One script per flush: publishes ("P"), commits ("C": a handled entry's XACK and
-- the effects of its handling), acknowledgements ("A": handled entries without
-- effects, one XACK per stream) and dead letters ("D"), in order, atomically.
-- Their fields travel in one blob, a msgpack array of strings (a few arguments per
-- flush, not thousands: the client's per-argument encoding dominated; the script
-- reads it with one cmsgpack.unpack, not field by field); every key shares the
-- hash tag of the one declared key, so a Redis Cluster keeps them on its node.
--
-- The group's pending-entries list is the record of what is not yet handled: a
-- commit's XACK answers 0 when the entry was acknowledged before (by this
-- consumer's retried flush, or by another consumer that ran it too), and then
-- the commit publishes nothing.
--
-- A commit is fenced: it names the partition's lease and the value ("consumer|epoch")
-- it held when its entry was delivered, and is refused whole (-3: no XACK, no effect,
-- no write) when the lease holds another. A worker frozen past its lease and thawed
-- commits nothing, whatever it ran meanwhile. A commit also carries the state its
-- handling wrote (a session's memory: key and value, an empty value deleting the key;
-- the run's journal, deleted), applied only with its XACK: memory is written if, and
-- only if, the handling that wrote it is the one committed.
--
-- The duplicate window: the ids published in each `window` ms live in one hash
-- ({name}:ids:B, B = server time / window); an id is known while it is in the
-- current or the previous hash, so for at least `window` ms and less than twice
-- that. The whole flush looks its ids up in two HMGETs and records the new ones
-- in one HSET (a key per id would cost a write and an expiry each).
--
-- KEYS[1]: the dead-letter stream, the one key declared (it names the node on a Redis
-- Cluster); ARGV[6] is the prefix of every key, that key's hash tag.
local call, byte = redis.call, string.byte
local window = tonumber(ARGV[1])
local maxlen = tonumber(ARGV[2])
local token = ARGV[3]
local group = ARGV[4]
local ops = ARGV[5]
local prefix = ARGV[6]
-- On a Redis Cluster every key of this script carries this partition's hash tag:
-- an effect bound for another partition goes to this one's relay stream (x),
-- from which the partition's owner publishes it there (deduplicated there).
local relay = ARGV[11] == '1' and (prefix .. 'x') or nil
local producer = ARGV[8]
-- A flush sent before this producer heard that an earlier one was refused for a
-- full stream has its new publishes refused: publishes keep their order.
local hold = prefix .. 'hold:' .. producer
local flush = tonumber(ARGV[9])
local refused = false
-- Every operation's fields, one flat msgpack array of strings (one C call to read).
local t = cmsgpack.unpack(ARGV[7])
local out = {}

-- Each operation's code and where its fields start, gathering the ids to look up.
local codes = {byte(ops, 1, -1)}
local starts = {}
local ids, nids = {}, 0
local known = {}
local P, C, A = byte('P'), byte('C'), byte('A')
-- On a Redis Cluster, every key this flush touches, once each (checked below).
local touched, ntouched, touching = {}, 0, {}
local function touch(key)
  if not touching[key] then
    touching[key] = true
    ntouched = ntouched + 1
    touched[ntouched] = key
  end
end
local k = 1
for i = 1, #codes do
  local op = codes[i]
  starts[i] = k
  if op == P then -- id, stream, wire, the publish's own number
    local id = t[k]
    if known[id] == nil then
      known[id] = false
      nids = nids + 1
      ids[nids] = id
    end
    if relay then touch(t[k + 1]) end
    k = k + 4
  elseif op == C then
    -- stream, entry, n, m, lease, holder, then n times id, stream, wire (the
    -- effects), then m times key, value (the state written)
    local n = tonumber(t[k + 2])
    local m = tonumber(t[k + 3])
    if relay then
      local lease = t[k + 4]
      touch(t[k])
      touch(lease)
      touch(prefix .. 'epoch:' .. string.sub(lease, #prefix + 7))
    end
    k = k + 6
    for j = 1, n do
      local id = t[k]
      if known[id] == nil then
        known[id] = false
        nids = nids + 1
        ids[nids] = id
      end
      if relay and string.sub(t[k + 1], 1, #prefix) == prefix then touch(t[k + 1]) end
      k = k + 3
    end
    if relay then
      for j = 0, m - 1 do touch(t[k + 2 * j]) end
    end
    k = k + 2 * m
  elseif op == A then -- stream, entry ids joined by commas
    if relay then touch(t[k]) end
    k = k + 2
  else -- 'D': stream, entry, wire, reason
    if relay then
      touch(t[k])
      touch(prefix .. 'dead')
    end
    k = k + 4
  end
end

local now = call('TIME')
local bucket = math.floor((tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)) / window)
local current = prefix .. 'ids:' .. bucket
local previous = prefix .. 'ids:' .. (bucket - 1)

-- While a Redis Cluster moves this partition's slot to another master (a resharding),
-- some of its keys may be there already, and a command on one of them would fail in the
-- middle of this script, after the writes before it. So, before any read or write,
-- every key it touches is looked up in one EXISTS, which Redis answers only when they
-- are all on this node (else TRYAGAIN or ASK, for a key not here, moved or not made
-- yet). Then the flush is refused whole, as TRYAGAIN, with nothing written: the client
-- sends it again after a pause, until the slot has moved (MOVED names its new master).
if relay then
  touch(hold)
  touch(current)
  touch(previous)
  touch(prefix .. 'ids:' .. (bucket - 2))
  touch(relay)
  for c = 1, ntouched, 1000 do
    local here = redis.pcall('EXISTS', unpack(touched, c, math.min(c + 999, ntouched)))
    if type(here) == 'table' and here.err then
      return redis.error_reply('TRYAGAIN the partition\'s slot is moving: ' .. here.err)
    end
  end
end
local held = call('GET', hold)
local blocked = held and tonumber(held) > tonumber(ARGV[10])
for c = 1, nids, 1000 do
  local last = math.min(c + 999, nids)
  local a = call('HMGET', current, unpack(ids, c, last))
  local b = call('HMGET', previous, unpack(ids, c, last))
  for j = 1, last - c + 1 do
    local v = a[j] or b[j]
    if v then known[ids[c + j - 1]] = v end
  end
end

-- The bound counts what is not handled yet: past maxlen, the entries every
-- group has handled go first (whole nodes of the stream, oldest first, down to
-- 90 %; entry by entry when no whole node could go). Each entry is trimmed
-- once, and a stream full of unhandled entries costs a few O(1) commands to
-- find so, once per stream and flush: no scan, whatever the backlog.
local function trim(skey, len)
  local ok, groups = pcall(call, 'XINFO', 'GROUPS', skey)
  if not ok or #groups == 0 then return len end
  local safe = nil
  local sms, sseq
  for _, g in ipairs(groups) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    local cand
    local p = call('XPENDING', skey, f['name'])
    if tonumber(p[1]) > 0 then
      cand = p[2]
    else
      local ms, seq = string.match(f['last-delivered-id'], "^(%d+)-(%d+)$")
      cand = ms .. '-' .. (tonumber(seq) + 1)
    end
    local cms, cseq = string.match(cand, "^(%d+)-(%d+)$")
    cms, cseq = tonumber(cms), tonumber(cseq)
    if safe == nil or cms < sms or (cms == sms and cseq < sseq) then
      safe, sms, sseq = cand, cms, cseq
    end
  end
  local need = len - math.floor(maxlen * 0.9)
  local freed = call('XTRIM', skey, 'MINID', '~', safe, 'LIMIT', need)
  if freed == 0 then freed = call('XTRIM', skey, 'MINID', safe) end
  return len - freed
end

-- Stream lengths, read once per script and kept up to date; a stream found full
-- is not looked at again in this flush.
local lens, full = {}, {}
local function has_room(skey)
  local len = lens[skey]
  if len == nil then len = call('XLEN', skey) end
  if len >= maxlen and not full[skey] then
    len = trim(skey, len)
    if len >= maxlen then full[skey] = true end
  end
  lens[skey] = len
  return len < maxlen
end

local fresh, nfresh = {}, 0
-- The leases the commits name, read once per flush.
local owners = {}

for i = 1, #codes do
  local op = codes[i]
  local f = starts[i]
  if op == P then
    local id = t[f]
    local seen = known[id]
    local skey = t[f + 1]
    local mine = producer .. '#' .. t[f + 3]
    local len = lens[skey]
    if seen == mine then
      out[i] = 1 -- this very publish, sent again (its answer was lost): accepted then
      known[id] = true -- a second time in this flush is a duplicate
    elseif seen then
      out[i] = 0
    elseif blocked then
      out[i] = -1
    elseif (len and len < maxlen) or has_room(skey) then
      call('XADD', skey, '*', 'e', t[f + 2])
      lens[skey] = lens[skey] + 1
      known[id] = true
      nfresh = nfresh + 2
      fresh[nfresh - 1] = id
      fresh[nfresh] = mine
      out[i] = 1
    else
      out[i] = -1
      refused = true
    end
  elseif op == C then
    -- Never refused for room: the effects of a handled entry are appended with
    -- its acknowledgement, so a full stream can always drain.
    local lease, holder = t[f + 4], t[f + 5]
    local owner = owners[lease]
    if owner == nil then
      owner = call('GET', lease) or false
      owners[lease] = owner
    end
    if owner == false then
      -- Lapsed, and nobody took it since (a take makes a new epoch): still the holder's,
      -- as renew.lua would find it (a slow renewal, a failover that lost its expiry).
      local epochs = prefix .. 'epoch:' .. string.sub(lease, #prefix + 7)
      if call('GET', epochs) == string.match(holder, '|(%d+)$') then owner = holder end
    end
    if owner ~= holder then
      out[i] = -3 -- the lease moved on: another consumer owns the entry's partition now
    elseif call('XACK', t[f], group, t[f + 1]) == 0 then
      out[i] = -2 -- acknowledged before: its effects were committed then
    else
      local n = tonumber(t[f + 2])
      local fresh_effects = 0
      for j = 1, n do
        local e = f + 3 + 3 * j
        local id, skey = t[e], t[e + 1]
        if relay and string.sub(skey, 1, #prefix) ~= prefix then
          call('XADD', relay, '*', 'e', t[e + 2])
          fresh_effects = fresh_effects + 1
        elseif not known[id] then
          if lens[skey] == nil or lens[skey] >= maxlen then has_room(skey) end
          call('XADD', skey, '*', 'e', t[e + 2])
          lens[skey] = lens[skey] + 1
          known[id] = true
          nfresh = nfresh + 2
          fresh[nfresh - 1] = id
          fresh[nfresh] = token
          fresh_effects = fresh_effects + 1
        end
      end
      local w = f + 6 + 3 * n
      for j = 0, tonumber(t[f + 3]) - 1 do
        local key, value = t[w + 2 * j], t[w + 2 * j + 1]
        if value == '' then call('DEL', key) else call('SET', key, value) end
      end
      out[i] = fresh_effects
    end
  elseif op == A then
    local entries = {}
    for entry in string.gmatch(t[f + 1], '[^,]+') do entries[#entries + 1] = entry end
    local n = 0
    for c = 1, #entries, 1000 do
      n = n + call('XACK', t[f], group, unpack(entries, c, math.min(c + 999, #entries)))
    end
    out[i] = n
  else -- 'D': dead letter, unless acknowledged before
    if call('XACK', t[f], group, t[f + 1]) == 1 then
      call('XADD', prefix .. 'dead', '*', 'e', t[f + 2], 'reason', t[f + 3],
        'stream', t[f], 'entry', t[f + 1])
      out[i] = 1
    else
      out[i] = 0
    end
  end
end

for c = 1, #fresh, 1000 do
  call('HSET', current, unpack(fresh, c, math.min(c + 999, #fresh)))
end
if refused then
  call('SET', hold, flush, 'PX', 600000)
end
if #fresh > 0 then
  call('PEXPIREAT', current, (bucket + 2) * window)
  -- Freed in the background: a window's ids may be many.
  call('UNLINK', prefix .. 'ids:' .. (bucket - 2))
end
return out
