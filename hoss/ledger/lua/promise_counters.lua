-- promise_counters: take what a pod's DRA devices draw on shared counters (partitions of one GPU drawing on its
-- memory, ...) while its binding is under way, so two workers that decide at the same instant never overdraw a
-- counter set between them. Each set's key holds, per device promised on it, the pod, the promise's end and what the
-- device draws:
--   {hoss}:counters:<driver>/<pool>/<set>   hash: '<driver>/<pool>/<device>' -> '<uid>|<until ms>|<counter>=<n>,...'
-- The pod passes, per counter set its allocation draws on: each counter's capacity, what the allocations its
-- decision saw draw on it (seen), what its own devices draw (mine), the devices its decision saw allocated there,
-- and its own devices with what each draws. What other pods' unexpired promises draw through devices its decision
-- did not see counts on top: the promise is refused when seen + unseen + mine passes a capacity (amounts in
-- thousandths of the counter's unit: the caller rounds capacities down and draws up). A pod's own earlier promises
-- are replaced.
-- ARGV: prefix, uid, ttl_ms, nsets, then per set: key ('<driver>/<pool>/<set>'), ncounters,
--   (counter, capacity, seen, mine) x ncounters, nseen, seen devices, nmine, (device, draws 'c=n,...') x nmine.
-- Reply: {'promised'} | {'overdrawn', key, counter, holder uid} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local uid = next_arg()
local ttl = next_number()
local now = now_ms()
local sets = {}
for s = 1, next_number() do
  local set = {key = PREFIX .. ':counters:' .. next_arg(), counters = {}, seen = {}, mine = {}}
  for c = 1, next_number() do
    set.counters[c] = {name = next_arg(), capacity = tonumber(next_arg()), seen = tonumber(next_arg()),
                       mine = tonumber(next_arg())}
  end
  for d = 1, next_number() do
    set.seen[next_arg()] = true
  end
  for d = 1, next_number() do
    set.mine[d] = {device = next_arg(), draws = next_arg()}
  end
  sets[s] = set
end

-- '<uid>|<until>|c=n,...' -> uid, until, {c = n}
local function parse(value)
  local holder, till, draws = string.match(value, '^([^|]*)|([^|]*)|(.*)$')
  local amounts = {}
  for name, amount in string.gmatch(draws or '', '([^,=]+)=([^,]+)') do
    amounts[name] = tonumber(amount)
  end
  return holder, tonumber(till) or 0, amounts
end

for _, set in ipairs(sets) do
  local unseen, holders = {}, {}
  local entries = redis.call('HGETALL', set.key)
  for i = 1, #entries, 2 do
    local device, holder, till, amounts = entries[i], parse(entries[i + 1])
    if till <= now or holder == uid then
      redis.call('HDEL', set.key, device)
    elseif not set.seen[device] then
      for name, amount in pairs(amounts) do
        unseen[name] = (unseen[name] or 0) + amount
        holders[name] = holder
      end
    end
  end
  for _, counter in ipairs(set.counters) do
    if counter.seen + (unseen[counter.name] or 0) + counter.mine > counter.capacity then
      return {'overdrawn', set.key, counter.name, holders[counter.name] or ''}
    end
  end
end
for _, set in ipairs(sets) do
  for _, mine in ipairs(set.mine) do
    redis.call('HSET', set.key, mine.device, uid .. '|' .. int_str(now + ttl) .. '|' .. mine.draws)
  end
  if redis.call('PTTL', set.key) < ttl then
    redis.call('PEXPIRE', set.key, ttl)
  end
end
return {'promised'}
