-- nominate: hold room on node for a preempting pod while the pods it evicts leave (see 'Nominations' in
-- common.lua); replaces the pod's earlier nomination, wherever it was.
-- ARGV: prefix, uid, node, priority, ttl_ms, n, n resource/amount pairs (the pod's request).
-- Reply: {'nominated', node} | {'assumed'|'bound', node} (the pod holds an entry already: nothing is held)
--        | {'unknown_node', node} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local uid = next_arg()
local node = next_arg()
local priority = next_number()
local ttl_ms = next_number()
local request = next_pairs()
if redis.call('SISMEMBER', NODES, node) == 0 then
  return {'unknown_node', node}
end
local entry = read_entry(uid)
if entry then
  return {entry.state, entry.node}
end
drop_nomination(uid)
local amounts = {}
for _, item in ipairs(request) do
  amounts[item[1]] = item[2]
end
local nomination = {node = node, priority = priority, deadline = int_str(now_ms() + ttl_ms), request = amounts}
redis.call('HSET', NOMINATED, uid, cjson.encode(nomination))
redis.call('SADD', node_key(node, 'nominated'), uid)
return {'nominated', node}
