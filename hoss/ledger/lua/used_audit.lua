-- used_audit: compare, at one instant, every node's used totals with the sums of its entries' requests (assumed,
-- admitted and bound: the invariant 'used is the sum of the entries' requests'). Read-only. ARGV: prefix.
-- Reply: a flat list of quadruples, one per differing node and resource: node, resource, kept, summed.
local reply = {}
local nodes = redis.call('SMEMBERS', NODES)
table.sort(nodes)
for _, node in ipairs(nodes) do
  local summed = {}
  for _, state in ipairs(STATES) do
    for _, uid in ipairs(redis.call('SMEMBERS', node_key(node, state))) do
      local entry = read_entry(uid)
      if entry then
        for _, item in ipairs(entry.request) do
          summed[item[1]] = (summed[item[1]] or 0) + tonumber(item[2])
        end
      end
    end
  end
  local kept = {}
  local flat = redis.call('HGETALL', node_key(node, 'used'))
  for i = 1, #flat, 2 do
    kept[flat[i]] = tonumber(flat[i + 1]) or 0
  end
  local resources = {}
  for resource in pairs(summed) do
    table.insert(resources, resource)
  end
  for resource in pairs(kept) do
    if summed[resource] == nil then
      table.insert(resources, resource)
    end
  end
  table.sort(resources)
  for _, resource in ipairs(resources) do
    local want, have = summed[resource] or 0, kept[resource] or 0
    if want ~= have then
      table.insert(reply, node)
      table.insert(reply, resource)
      table.insert(reply, int_str(have))
      table.insert(reply, int_str(want))
    end
  end
end
return reply
