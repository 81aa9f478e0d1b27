-- quotas: one consistent read of every elastic quota and its namespace's use (see 'Elastic quotas' in
-- common.lua). Read-only. ARGV: prefix.
-- Reply: {count, then per namespace (sorted): name, min pairs (n, then n resource/amount), max pairs, used
--         pairs}, then the sums: min pairs, used pairs
local names = redis.call('SMEMBERS', QUOTAS)
table.sort(names)
local reply = {#names}
local all_used = redis.call('HGETALL', NS_USED)
for _, ns in ipairs(names) do
  table.insert(reply, ns)
  local min, max = {}, {}
  local flat = redis.call('HGETALL', quota_key(ns))
  for i = 1, #flat, 2 do
    local kind, resource = string.match(flat[i], '^(m[a-z][a-z]):(.*)$')
    if kind == 'min' then
      table.insert(min, resource)
      table.insert(min, flat[i + 1])
    elseif kind == 'max' then
      table.insert(max, resource)
      table.insert(max, flat[i + 1])
    end
  end
  flat_append(reply, min)
  flat_append(reply, max)
  local used = {}
  for i = 1, #all_used, 2 do
    if string.sub(all_used[i], 1, #ns + 1) == ns .. '/' then
      table.insert(used, string.sub(all_used[i], #ns + 2))
      table.insert(used, all_used[i + 1])
    end
  end
  flat_append(reply, used)
end
flat_append(reply, redis.call('HGETALL', QUOTA_SUM_MIN))
flat_append(reply, redis.call('HGETALL', QUOTA_SUM_USED))
return reply
