-- sync_node: register a node or replace its allocatable and labels; its entries and used totals stay (a node
-- that shrank below its used totals is overcommitted until pods leave, and admits nothing that grows them).
-- ARGV: prefix, node, n, n resource/amount pairs, m, m label/value pairs, spec (compact node JSON, '' = none).
-- Reply: {'synced', new (0|1)} | NOT_READY. Appends the spec and the node's used totals to the change stream.
if not is_ready() then
  return NOT_READY
end
local node = next_arg()
local alloc = next_pairs()
local labels = next_pairs()
local spec = next_arg() or ''
local new = redis.call('SADD', NODES, node)
set_hash(node_key(node, 'alloc'), alloc)
set_hash(node_key(node, 'labels'), labels)
redis.call('SET', node_key(node, 'spec'), spec)
add_change({'t', 's', 'n:' .. node, spec})
add_change({'t', 'u', 'n:' .. node, used_text(node)})
return {'synced', new}
