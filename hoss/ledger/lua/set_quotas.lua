-- set_quotas: write elastic quotas (scheduler-plugins' ElasticQuota, see 'Elastic quotas' in common.lua).
-- ARGV: prefix, replace (1: the list is every quota, namespaces not in it lose theirs; 0: only the listed
-- namespaces change), count, then per namespace: name, present (0: its quota was deleted), min pairs (n, then n
-- resource/amount pairs), max pairs. Runs whether or not the ledger is ready (the sync writes every quota just
-- before a rebuild, so the rebuilt ledger enforces them from its first call).
-- The sums (min, and used over the quota namespaces) follow.
-- Reply: {'quotas', number of namespaces with a quota}
local replace = next_number() == 1
local listed = {}
local changes = {}
for i = 1, next_number() do
  local ns = next_arg()
  local present = next_number() == 1
  changes[i] = {ns = ns, present = present, min = next_pairs(), max = next_pairs()}
  listed[ns] = true
end
if replace then
  for _, ns in ipairs(redis.call('SMEMBERS', QUOTAS)) do
    if not listed[ns] then
      table.insert(changes, {ns = ns, present = false, min = {}, max = {}})
    end
  end
end
for _, change in ipairs(changes) do
  local key = quota_key(change.ns)
  local had = redis.call('SISMEMBER', QUOTAS, change.ns) == 1
  redis.call('DEL', key)
  if change.present then
    local fields = {}
    for _, item in ipairs(change.min) do
      table.insert(fields, 'min:' .. item[1])
      table.insert(fields, item[2])
    end
    for _, item in ipairs(change.max) do
      table.insert(fields, 'max:' .. item[1])
      table.insert(fields, item[2])
    end
    if #fields > 0 then
      redis.call('HSET', key, unpack(fields))
    end
    redis.call('SADD', QUOTAS, change.ns)
  else
    redis.call('SREM', QUOTAS, change.ns)
  end
  if had ~= change.present then
    -- the namespace's used joins or leaves the quota namespaces' sum
    local sign = change.present and '' or '-'
    local flat = redis.call('HGETALL', NS_USED)
    local prefix = change.ns .. '/'
    for i = 1, #flat, 2 do
      if string.sub(flat[i], 1, #prefix) == prefix then
        local resource = string.sub(flat[i], #prefix + 1)
        if redis.call('HINCRBY', QUOTA_SUM_USED, resource, sign .. flat[i + 1]) == 0 then
          redis.call('HDEL', QUOTA_SUM_USED, resource)
        end
      end
    end
  end
end
-- The sum of min, recomputed (tenants are few); a resource named in some min is in it even at 0, so nothing of
-- it may be borrowed then.
redis.call('DEL', QUOTA_SUM_MIN)
for _, ns in ipairs(redis.call('SMEMBERS', QUOTAS)) do
  local flat = redis.call('HGETALL', quota_key(ns))
  for i = 1, #flat, 2 do
    local resource = string.match(flat[i], '^min:(.*)$')
    if resource then
      redis.call('HINCRBY', QUOTA_SUM_MIN, resource, flat[i + 1])
    end
  end
end
return {'quotas', redis.call('SCARD', QUOTAS)}
