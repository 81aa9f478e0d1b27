-- quota_audit: compare, at one instant, the quota namespaces' used totals ('Elastic quotas' in common.lua) with the
-- sums of their entries' requests. Read-only. ARGV: prefix.
-- Reply: a flat list of triples, one per differing namespace and resource: '<ns>/<resource>', kept, summed
-- ('sum' as the namespace for the quota namespaces' total).
local quota = {}
for _, ns in ipairs(redis.call('SMEMBERS', QUOTAS)) do
  quota[ns] = true
end
local summed, total = {}, {}
for _, node in ipairs(redis.call('SMEMBERS', NODES)) do
  for _, state in ipairs(STATES) do
    for _, uid in ipairs(redis.call('SMEMBERS', node_key(node, state))) do
      local entry = read_entry(uid)
      local ns = entry and namespace_of(entry.pod)
      if entry and quota[ns] then
        for _, item in ipairs(entry.request) do
          local key = ns .. '/' .. item[1]
          summed[key] = (summed[key] or 0) + tonumber(item[2])
          total[item[1]] = (total[item[1]] or 0) + tonumber(item[2])
        end
      end
    end
  end
end
local reply = {}
local function compare(key, kept, sum)
  kept, sum = tonumber(kept) or 0, sum or 0
  if kept ~= sum then
    table.insert(reply, key)
    table.insert(reply, int_str(kept))
    table.insert(reply, int_str(sum))
  end
end
local flat = redis.call('HGETALL', NS_USED)
local kept = {}
for i = 1, #flat, 2 do
  local ns = string.match(flat[i], '^([^/]*)/')
  if quota[ns] then
    kept[flat[i]] = flat[i + 1]
  end
end
for key, sum in pairs(summed) do
  compare(key, kept[key], sum)
end
for key, value in pairs(kept) do
  if not summed[key] then
    compare(key, value, 0)
  end
end
local sums = redis.call('HGETALL', QUOTA_SUM_USED)
local kept_total = {}
for i = 1, #sums, 2 do
  kept_total[sums[i]] = sums[i + 1]
end
for resource, sum in pairs(total) do
  compare('sum/' .. resource, kept_total[resource], sum)
end
for resource, value in pairs(kept_total) do
  if not total[resource] then
    compare('sum/' .. resource, value, 0)
  end
end
return reply
