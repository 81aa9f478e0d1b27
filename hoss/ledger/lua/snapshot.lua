-- snapshot: one consistent read of the ready flag, the epoch and, per node (sorted by name), alloc, used, the
-- number of assumed, admitted and bound entries, and labels. Read-only.
-- ARGV: prefix, n, n node names (n = 0: every node; names that are not nodes are left out).
-- Reply: {ready (0|1), epoch or '', count, then per node: name, a, a alloc pairs, u, u used pairs,
--         assumed count, bound count, admitted count, l, l label pairs}
local names = {}
local wanted = next_number()
if wanted == 0 then
  names = redis.call('SMEMBERS', NODES)
else
  for _ = 1, wanted do
    local name = next_arg()
    if redis.call('SISMEMBER', NODES, name) == 1 then
      table.insert(names, name)
    end
  end
end
table.sort(names)
local ready = 0
if is_ready() then
  ready = 1
end
local reply = {ready, redis.call('GET', EPOCH) or '', #names}
for _, node in ipairs(names) do
  table.insert(reply, node)
  flat_append(reply, redis.call('HGETALL', node_key(node, 'alloc')))
  flat_append(reply, redis.call('HGETALL', node_key(node, 'used')))
  table.insert(reply, redis.call('SCARD', node_key(node, 'assumed')))
  table.insert(reply, redis.call('SCARD', node_key(node, 'bound')))
  table.insert(reply, redis.call('SCARD', node_key(node, 'admitted')))
  flat_append(reply, redis.call('HGETALL', node_key(node, 'labels')))
end
return reply
