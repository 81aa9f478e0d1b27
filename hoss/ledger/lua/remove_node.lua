-- remove_node: forget a node and every entry on it. ARGV: prefix, node. Reply: {'removed', uids...} | NOT_READY
if not is_ready() then
  return NOT_READY
end
local reply = {'removed'}
local node = next_arg()
for _, uid in ipairs(remove_node(node)) do
  table.insert(reply, uid)
end
settle_domains(add_change({'t', 'd', 'n:' .. node, ''}))
return reply
